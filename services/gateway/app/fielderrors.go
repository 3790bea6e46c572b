package app

import (
	"regexp"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
)

// fieldErrors turns kin-openapi's validation error into one fieldError
// per problem: the body field by its JSON path (labels.team,
// command.2), a parameter as "query limit" or "header Idempotency-Key".
func fieldErrors(err error) []fieldError {
	var out []fieldError
	var walk func(where string, err error)
	// kin-openapi's errors are walked by their concrete types: errors.As
	// would not do, as MultiError.As matches any of its members (and a
	// RequestError unwraps to its MultiError), losing which parameter or
	// body a problem is of.
	walk = func(where string, err error) {
		switch e := err.(type) { //nolint:errorlint // see above

		case openapi3.MultiError:
			for _, inner := range e {
				walk(where, inner)
			}
		case *openapi3filter.RequestError:
			w := where
			if p := e.Parameter; p != nil {
				w = p.In + " " + p.Name
			}
			switch e.Err.(type) { //nolint:errorlint // see above
			case nil:
				out = append(out, fieldError{Field: orBody(w), Reason: e.Reason})
			case openapi3.MultiError, *openapi3.SchemaError:
				walk(w, e.Err)
			default:
				out = append(out, fieldError{Field: orBody(w), Reason: strings.TrimSpace(e.Reason + " " + e.Err.Error())})
			}
		case *openapi3.SchemaError:
			out = append(out, schemaField(where, e))
		default:
			out = append(out, fieldError{Field: orBody(where), Reason: err.Error()})
		}
	}
	walk("", err)
	return out
}

var propertyReason = regexp.MustCompile(`^property "([^"]+)" is (unsupported|missing)$`)

// schemaField names the field a schema error is about: a property the
// schema does not have ("unknown field") or lacks ("required") is named
// itself, not its parent.
func schemaField(where string, e *openapi3.SchemaError) fieldError {
	path := e.JSONPointer()
	reason := e.Reason
	if m := propertyReason.FindStringSubmatch(reason); m != nil {
		path = append(path, m[1])
		reason = map[string]string{"unsupported": "not a field of this request (unknown fields are refused)",
			"missing": "required"}[m[2]]
	}
	field := strings.Join(path, ".")
	if where != "" && field != "" && strings.Contains(where, " ") {
		field = where + "." + field
	} else if field == "" {
		field = where
	}
	return fieldError{Field: orBody(field), Reason: reason}
}

func orBody(field string) string {
	if field == "" {
		return "body"
	}
	return field
}
