// Package agent holds the node agent's decisions, free of NATS, Redis and
// the OTel SDK: what a node registers as (Describe), how GPU health moves
// with Xid, ECC and lost-GPU reports (HealthBook), whether a start, stop or
// drain command is carried out (DecideStart, DecideStop, DecideDrain,
// StopGrace), the environment a workload runs with (WorkloadEnv), which
// workloads must stop after the node was fenced (Reconcile), whether the
// node must register again (MustRegister), how a node's drain moves (Drain),
// why and when a workload stopped (ExitReason, Ended, FailedToStart), and
// the events that report all of it (Events). The app package wires these to
// the bus, the capacity store and the workload runtime.
package agent
