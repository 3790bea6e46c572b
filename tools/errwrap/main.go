// Command errwrap reports an error formatted with a verb other than %w by
// a printf-like function that returns an error, other than fmt.Errorf
// (errorlint checks that one): fault.Invalid("decode: %v", err) flattens
// the chain, so errors.Is and errors.As no longer see the cause;
// fault.Invalid("decode: %w", err) keeps it.
//
// A printf-like function is one whose last two parameters are a format
// string and ...any and whose only result is an error. Calls with a
// non-constant format or explicit argument indexes (%[1]v) are skipped.
//
// Run it through scripts/lint.sh, or by hand from the repository root:
//
//	"$(GOWORK=off go -C tools tool -n errwrap)" ./services/metering/...
package main

import (
	"go/ast"
	"go/constant"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/analysis/singlechecker"
	"golang.org/x/tools/go/ast/inspector"
)

// Analyzer is the errwrap check.
var Analyzer = &analysis.Analyzer{
	Name:     "errwrap",
	Doc:      "report errors formatted with %v or %s by printf-like functions that return an error (wrap them with %w)",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      run,
}

func main() { singlechecker.Main(Analyzer) }

var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

func run(pass *analysis.Pass) (any, error) {
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	ins.Preorder([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node) {
		call := n.(*ast.CallExpr)
		fn, ok := callee(pass, call)
		if !ok || call.Ellipsis.IsValid() {
			return
		}
		sig := fn.Type().(*types.Signature)
		nf := sig.Params().Len() - 2 // index of the format parameter
		if len(call.Args) <= nf+1 {
			return
		}
		tv, ok := pass.TypesInfo.Types[call.Args[nf]]
		if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
			return
		}
		verbs, ok := formatVerbs(constant.StringVal(tv.Value))
		if !ok {
			return
		}
		for i, arg := range call.Args[nf+1:] {
			if i >= len(verbs) {
				break
			}
			t := pass.TypesInfo.TypeOf(arg)
			if t == nil || !types.Implements(t, errorType) || verbs[i] == 'w' {
				continue
			}
			pass.Reportf(arg.Pos(), "%s formats an error with %%%c, which flattens its chain: use %%w", fn.Name(), verbs[i])
		}
	})
	return nil, nil
}

// callee is the printf-like function call calls, if it is one.
func callee(pass *analysis.Pass, call *ast.CallExpr) (*types.Func, bool) {
	var id *ast.Ident
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	default:
		return nil, false
	}
	fn, ok := pass.TypesInfo.Uses[id].(*types.Func)
	if !ok || (fn.Pkg() != nil && fn.Pkg().Path() == "fmt") {
		return nil, false
	}
	sig, ok := fn.Type().(*types.Signature)
	if !ok || !sig.Variadic() || sig.Params().Len() < 2 || sig.Results().Len() != 1 {
		return nil, false
	}
	if !types.Identical(sig.Results().At(0).Type(), types.Universe.Lookup("error").Type()) {
		return nil, false
	}
	ps := sig.Params()
	format, ok := ps.At(ps.Len() - 2).Type().(*types.Basic)
	if !ok || format.Kind() != types.String {
		return nil, false
	}
	args, ok := ps.At(ps.Len() - 1).Type().(*types.Slice)
	if !ok {
		return nil, false
	}
	if iface, ok := args.Elem().Underlying().(*types.Interface); !ok || !iface.Empty() {
		return nil, false
	}
	return fn, true
}

// formatVerbs lists the verb of each argument the format consumes (a '*'
// width or precision consumes one too, recorded as '*'); ok is false for
// explicit argument indexes.
func formatVerbs(format string) (verbs []rune, ok bool) {
	rs := []rune(format)
	for i := 0; i < len(rs); i++ {
		if rs[i] != '%' {
			continue
		}
		i++
		for ; i < len(rs); i++ {
			switch r := rs[i]; {
			case r == '[':
				return nil, false
			case r == '*':
				verbs = append(verbs, '*')
			case r == '+' || r == '-' || r == '#' || r == ' ' || r == '0' || r == '.' || (r >= '1' && r <= '9'):
			case r == '%':
				goto next
			default:
				verbs = append(verbs, r)
				goto next
			}
		}
	next:
	}
	return verbs, true
}
