#!/usr/bin/env bash
# Runs every test of every workspace module with the race detector. The
# tests start their own nats-server (in process) and redis-server (a child
# process) on random ports, so nothing needs to be running; redis-server
# must be installed, and this script installs it with apt-get when it is
# missing and it can.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing redis-server (the tests start their own)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "test.sh: redis-server is missing; install it with: sudo apt-get install -y redis-server" >&2
    exit 1
  fi
fi

# go-nvml is cgo; NVML 13 headers warn about deprecated calls.
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
go test -race -count=1 "$@" work
# Tests that turn JetStream off in a running server cannot run under the
# race detector (a race inside nats-server): they are built without it.
if [ $# -eq 0 ]; then
  go test -count=1 -run 'JetStreamOutage' ./services/failover/app
fi
