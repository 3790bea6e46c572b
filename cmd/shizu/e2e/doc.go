// Package e2e holds Shizu's full-stack chaos tests: the real scheduler,
// metering and failover services (their app.Run, each with its own NATS
// user) in the test process, real node-agent child processes with simulated
// H100x8 hosts, an in-process NATS server with the topology's users and a
// system account (failover's disconnect fast path), and a real redis-server.
//
// The tests SIGKILL agents (crashes) and SIGSTOP/SIGCONT one (a silent
// partition that heals after fencing) and check what issue 7 asks: every
// affected rental is placed again by the scheduler and runs again
// elsewhere, no rental runs twice, the capacity store neither leaks nor
// double-counts, and metering bills nothing for the dead interval.
// BenchmarkChaosSIGKILL is the full scenario (20 nodes, 200
// rentals, 4 kills) and reports detection and re-placement times:
//
//	cd cmd/shizu && go test -run '^$' -bench ChaosSIGKILL -benchtime=1x ./e2e/
//
// A spot interruption notice (make-before-break) is sent to a child agent
// with SIGUSR1 (its -simulate-notice-lead). A rental whose node dies
// before its next beat is built with an agent that beats every two
// minutes (startAgentBeating), so the case is checked on every run.
//
// The package has only tests; it needs cgo and a C compiler (the node agent
// links go-nvml) and redis-server on PATH.
package e2e
