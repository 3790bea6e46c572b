#!/usr/bin/env bash
# Regenerates the Go code of every proto/shizu/<version>/*.proto into
# proto/shizu/<version>/*.pb.go, with Debian's protoc and the protoc-gen-go
# pinned as a tool in proto/go.mod. Runs from any directory.
#
# Needs: protoc 3.21.12 with the well-known types
#   (apt-get install -y protobuf-compiler libprotobuf-dev)
# and Go (protoc-gen-go is built by `go tool` from proto/go.mod).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly module=github.com/shizu-gpu/shizu/proto
readonly want_protoc="libprotoc 3.21.12"
readonly install_hint="apt-get install -y protobuf-compiler libprotobuf-dev"

die() {
	echo "genproto: $*" >&2
	exit 1
}

command -v protoc >/dev/null 2>&1 ||
	die "protoc not found; install it with: $install_hint"
command -v go >/dev/null 2>&1 ||
	die "go not found; install Go 1.26.8 (see go.work)"

have_protoc="$(protoc --version)"
if [[ "$have_protoc" != "$want_protoc" ]]; then
	# The version is written into every generated header, so another version
	# makes check-genproto.sh report stale code even when nothing changed.
	echo "genproto: warning: $have_protoc found, the checked-in code was generated with $want_protoc" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# protoc finds the well-known types next to its own binary
# (/usr/bin/../include); without libprotobuf-dev they are missing and every
# import of google/protobuf/*.proto fails. Probe once for a clear message.
mkdir -p "$tmp/probe"
printf 'syntax = "proto3";\nimport "google/protobuf/timestamp.proto";\nimport "google/protobuf/duration.proto";\n' >"$tmp/probe/probe.proto"
protoc -I "$tmp/probe" --descriptor_set_out=/dev/null "$tmp/probe/probe.proto" 2>"$tmp/probe.err" ||
	die "protoc cannot find the well-known types ($(head -n1 "$tmp/probe.err")); install them with: $install_hint"

plugin="$(go -C proto tool -n protoc-gen-go)" ||
	die "cannot build protoc-gen-go from proto/go.mod (go -C proto tool -n protoc-gen-go)"

shopt -s nullglob
protos=(proto/shizu/*/*.proto)
((${#protos[@]} > 0)) || die "no .proto files under proto/shizu/"

# Generate into a scratch tree, then replace the old output, so a deleted
# .proto leaves no orphaned .pb.go behind and a failed run changes nothing.
mkdir -p "$tmp/out"
protoc -I proto \
	--plugin=protoc-gen-go="$plugin" \
	--go_out="$tmp/out" --go_opt=module="$module" \
	"${protos[@]}"

for dir in proto/shizu/*/; do
	rm -f "$dir"*.pb.go
done
cp -R "$tmp/out/." proto/

echo "genproto: generated $(find "$tmp/out" -name '*.pb.go' | wc -l) files from ${#protos[@]} .proto files"
