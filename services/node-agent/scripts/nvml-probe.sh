#!/usr/bin/env bash
# Prints, as JSON, what the node agent's real NVML backend reads on this
# host: device count, names, model tokens, UUIDs, VRAM, PCI bus ids, MIG mode
# and instances, NVLink links/peers/domains, confidential-computing (TEE)
# state, two telemetry samples and any Xid/ECC event, then runs the one
# test that exercises the real backend. Meant to be run once on a GPU
# machine from the repository root:  services/node-agent/scripts/nvml-probe.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi not found"
go build -o "${TMPDIR:-/tmp}/nvml-probe" ./cmd/nvml-probe
rc=0
"${TMPDIR:-/tmp}/nvml-probe" -interval 1s || rc=$?
if [ "$rc" = 3 ]; then echo "no NVIDIA driver on this host"; fi
go test -count=1 -v -run 'TestRealDriverIsReadWhenPresent' ./gpu/nvmlgpu/
exit "$rc"
