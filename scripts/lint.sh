#!/usr/bin/env bash
# Static checks beyond gofmt and go vet (for CI and before a commit):
#   - golangci-lint (.golangci.yml) over every module of go.work, in one run;
#   - errwrap (tools/errwrap): errors formatted with %w by fault.* and every
#     other printf-like function returning an error;
#   - deadcode: functions no command reaches (tools/deadcode.allow lists
#     the ones kept on purpose);
#   - buf lint for proto/ (proto/buf.yaml);
#   - buf breaking for proto/ against the recorded schema
#     proto/buf-baseline.binpb (not HEAD: CI checks the submitted commit
#     itself, so "the last commit" would be the change under review).
# Fails when any of them reports a finding; every check runs either way.
#
# Usage: scripts/lint.sh [go|proto]...   (default: both)
#        scripts/lint.sh baseline        (re-record proto/buf-baseline.binpb;
#                                         only for a reviewed change, see docs/lint.md)
#
# Both tools are pinned in tools/go.mod, a module outside go.work (its build
# list must not change the services'). `go tool -n` builds one into the Go
# build cache on first use (about 5 minutes each on 2 cores) and prints its
# path; later runs only look it up.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
readonly baseline=proto/buf-baseline.binpb

die() {
	echo "lint: $*" >&2
	exit 1
}

tool() {
	GOWORK=off go -C tools tool -n "$1" ||
		die "cannot build $1 from tools/go.mod (GOWORK=off go -C tools tool -n $1)"
}

lint_go() {
	local golangci errwrap deadcode dirs dir patterns=() status=0
	golangci="$(tool golangci-lint)" || exit 1
	errwrap="$(tool errwrap)" || exit 1
	deadcode="$(tool deadcode)" || exit 1
	dirs="$(go list -m -f '{{.Dir}}')" || die "go list -m failed (run from a checkout with go.work)"
	for dir in $dirs; do
		patterns+=("./${dir#"$root"/}/...")
	done
	((${#patterns[@]} > 0)) || die "go list -m found no workspace modules"
	echo "==> golangci-lint (${#patterns[@]} modules)"
	"$golangci" run --config "$root/.golangci.yml" "${patterns[@]}" || status=1

	# errorlint checks fmt.Errorf only; errwrap checks every other printf-like
	# function that returns an error (fault.Invalid, the CLI's usagef, ...).
	echo "==> errwrap (errors wrapped with %w by fault.* and other Errorf-like functions)"
	"$errwrap" "${patterns[@]}" || status=1

	# golangci-lint's unused sees unexported code only. deadcode finds every
	# function no main package can reach (so also exported APIs only tests
	# call); the ones kept on purpose are listed in tools/deadcode.allow.
	echo "==> deadcode (functions no command reaches; kept ones in tools/deadcode.allow)"
	local found unexpected
	found="$("$deadcode" -f '{{range .Funcs}}{{$.Path}}.{{.Name}} {{.Position.File}}:{{.Position.Line}}{{"\n"}}{{end}}' \
		-filter '^github.com/shizu-gpu/shizu/' ./cmd/shizu ./services/*/cmd/*)" || die "deadcode failed"
	unexpected="$(awk -v root="$root/" '
		FNR == NR { sub(/#.*/, ""); gsub(/[ \t]+/, ""); if ($0 != "") allowed[$0] = 1; next }
		$0 == "" { next }
		{ sub(/^github.com\/shizu-gpu\/shizu\//, "", $1); sub(root, "", $2) }
		!($1 in allowed) { print $2 ": unreachable func " $1 }
	' "$root/tools/deadcode.allow" - <<<"$found")"
	if [[ -n "$unexpected" ]]; then
		echo "$unexpected"
		echo "deadcode: delete these, move test-only helpers into a package no command imports, or list the ones kept on purpose (with the reason) in tools/deadcode.allow"
		status=1
	fi
	return "$status"
}

lint_proto() {
	local buf status=0
	buf="$(tool buf)" || exit 1
	echo "==> buf lint"
	"$buf" lint proto || status=1
	echo "==> buf breaking (against $baseline)"
	[[ -f "$baseline" ]] || die "$baseline is missing: see docs/lint.md"
	"$buf" breaking proto --against "$baseline" || status=1
	return "$status"
}

record_baseline() {
	local buf
	buf="$(tool buf)" || exit 1
	"$buf" lint proto || exit 1
	"$buf" build proto --exclude-source-info -o "$baseline"
	echo "lint: recorded $baseline; commit it with the reviewed .proto change"
}

(($# > 0)) || set -- go proto
status=0
for what in "$@"; do
	case "$what" in
	go) lint_go || status=1 ;;
	proto) lint_proto || status=1 ;;
	baseline) record_baseline ;;
	*) die "unknown check $what (go, proto or baseline)" ;;
	esac
done
if ((status)); then
	echo "lint: findings above" >&2
fi
exit "$status"
