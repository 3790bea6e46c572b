// Package faults is Shizu's fault harness (issue 14): the deployed shape
// as child processes — nats-server (the pinned module v2.15.2, built into
// a binary once per test binary: Debian's is 2.9) with JetStream fsynced
// before every ack and the topology's users and system account,
// redis-server with or without an AOF, the scheduler, metering, failover
// and autoscaler binaries, and node agents on simulated H100x8 hosts — so
// that each part can be SIGKILLed and started again. It is the one place
// Shizu's tests run the servers as processes instead of in-process.
//
// Each scenario places a mixed load (whole GPUs, fractions, a pair,
// spot and on-demand, short workloads that complete, cancels) from three
// publishers, breaks something while more requests arrive, waits for the
// platform to settle, then cancels every rental and waits for metering.
// The invariant checker (invariants_test.go, a pure function of what the
// RENTALS and BILLING streams, the capacity store and /proc hold) reports:
// acked requests, lost ones (acked, no outcome), double outcomes,
// over-committed GPUs, leaked allocations, live rentals without their
// allocation, rentals running twice, evicted healthy rentals, run and
// billed seconds (unbilled, double-billed), preemptions and their delay
// past the notice, and the time to settle.
//
// Scenarios: nats-server killed for 5 s and 30 s; Redis killed with an
// AOF and without persistence; each service killed and restarted; two
// scheduler replicas killed in turn (10 kills); an agent's wall clock
// stepped an hour forward and two back; poison of every kind on every
// consumed subject (each must be dead-lettered with a reason); a
// preemption storm (spot fill, then an on-demand burst).
//
// TestFaults is the bounded run, part of the workspace's test command
// (shorter outages, fewer kills, 3 hosts). One scenario can be chosen:
//
//	cd cmd/shizu && SHIZU_FAULTS=nats-kill-5s,poison go test -run TestFaults -v ./faults/
//
// BenchmarkFaults is the full run (6 hosts, 30 s outage, 10 kills); it
// prints a table row per scenario and reports the figures as metrics:
//
//	cd cmd/shizu && go test -run '^$' -bench Faults -benchtime=1x -timeout 60m -v ./faults/
//
// The deployment's folder (logs/*.log per process, the NATS store, the
// Redis directory) is kept and its path printed when a test fails. The
// package has only tests and needs cgo and a C compiler (the node agent
// links go-nvml) and redis-server on PATH. docs/faults.md has the figures.
package faults
