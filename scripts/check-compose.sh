#!/usr/bin/env bash
# Validates docker-compose.yml (or the file given as $1) without a Docker engine:
# schema, interpolation, anchors and merge keys, depends_on conditions. It does not
# build images, pull them, or check that build contexts and bind-mount sources exist.
#
# Uses the first validator that is available:
#   1. `docker compose` (the Compose v2 plugin), if installed;
#   2. `docker-compose` (v1, e.g. Debian's docker-compose 1.29.2);
#   3. on CI (CI=true) or with SHIZU_INSTALL=1, as root with apt-get: installs
#      Debian's docker-compose, then uses it.
# Otherwise it says how to install one and exits 1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

file="${1:-docker-compose.yml}"
[[ -f "$file" ]] || {
	echo "check-compose: $file not found" >&2
	exit 1
}

validate_v2() { docker compose -f "$file" config -q; }
validate_v1() { docker-compose -f "$file" config -q; }

report() {
	local rc=$1 tool=$2
	if ((rc == 0)); then
		echo "check-compose: $file is valid ($tool)"
	else
		echo "check-compose: $file is INVALID ($tool, exit $rc)" >&2
	fi
	exit "$rc"
}

if command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
	rc=0
	validate_v2 || rc=$?
	report "$rc" "docker compose"
fi

if ! command -v docker-compose >/dev/null 2>&1; then
	if [[ "${CI:-}" == "true" || "${SHIZU_INSTALL:-}" == "1" ]] &&
		[[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
		echo "check-compose: installing docker-compose with apt-get" >&2
		export DEBIAN_FRONTEND=noninteractive
		log="$(mktemp)"
		trap 'rm -f "$log"' EXIT
		# A fresh machine may have no package lists yet: update once and retry.
		if ! apt-get install -y -q docker-compose >"$log" 2>&1 &&
			! { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q docker-compose >>"$log" 2>&1; }; then
			cat "$log" >&2
			echo "check-compose: apt-get install docker-compose failed" >&2
			exit 1
		fi
	fi
fi

if command -v docker-compose >/dev/null 2>&1; then
	rc=0
	validate_v1 || rc=$?
	report "$rc" "docker-compose $(docker-compose version --short 2>/dev/null || echo v1)"
fi

cat >&2 <<'MSG'
check-compose: no compose validator found. Install one of:
  - Docker's Compose v2 plugin (`docker compose`), see https://docs.docker.com/compose/install/
  - Debian's docker-compose:  apt-get install -y docker-compose
or rerun as root with SHIZU_INSTALL=1 (or CI=true) to let this script install it.
MSG
exit 1
