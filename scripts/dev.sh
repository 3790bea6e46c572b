#!/bin/sh
# scripts/dev.sh: build shizu into bin/ and run `shizu dev`, the whole
# platform on this machine. Arguments go to `shizu dev`:
#
#   scripts/dev.sh                 # state in ./.shizu
#   scripts/dev.sh -ephemeral      # state in a temporary folder
#
# --build-only builds and exits; SHIZU_BIN names the binary (default
# bin/shizu); SHIZU_RELEASE the release it names (default dev).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${SHIZU_BIN:-$root/bin/shizu}
build_only=false
if [ "${1:-}" = "--build-only" ]; then
  build_only=true
  shift
fi

# go-nvml is cgo: the NVML 13 header marks calls deprecated and gcc warns
# about each on a cold build (a hundred lines and more); they are not ours.
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

# The commit the binary names (`shizu version`): go build stamps it in a
# plain clone; a git worktree or GOFLAGS=-buildvcs=false stamps none.
commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
modified=false
if [ -n "$commit" ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  modified=true
fi
ldflags="-X main.release=${SHIZU_RELEASE:-dev} -X main.commit=$commit -X main.modified=$modified"

if [ -x "$bin" ]; then
  echo "building shizu into ${bin#"$root"/}…" >&2
else
  echo "building shizu into ${bin#"$root"/} (the first run takes a few minutes)…" >&2
fi
mkdir -p "$(dirname "$bin")"
cd "$root"
go build -buildvcs=auto -ldflags "$ldflags" -o "$bin" ./cmd/shizu
if $build_only; then
  exit 0
fi
exec "$bin" dev "$@"
