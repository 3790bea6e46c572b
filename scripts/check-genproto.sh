#!/usr/bin/env bash
# Fails when the checked-in generated Go code under proto/ does not match what
# scripts/genproto.sh produces from the .proto files (for CI). Runs from any
# directory; leaves the regenerated files in place so they can be committed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/genproto.sh

stale=0
if ! git diff --exit-code --stat -- proto/; then
	stale=1
fi
untracked="$(git ls-files --others --exclude-standard -- 'proto/*.pb.go')"
if [[ -n "$untracked" ]]; then
	echo "untracked generated files:" >&2
	echo "$untracked" >&2
	stale=1
fi

if ((stale)); then
	echo "generated code is stale: run scripts/genproto.sh" >&2
	exit 1
fi
echo "check-genproto: generated code is up to date"
