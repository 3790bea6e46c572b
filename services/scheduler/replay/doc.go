// Package replay runs a GPU cluster trace (the Alibaba "openb" trace of the
// FGD paper, ../../../../shared/notes/FGD.md) through the placement package
// and measures placement quality: GPU allocation ratio, unallocated GPU,
// fragmentation amount and rate, binned by arrived workload.
//
// Two modes:
//
//   - [ModeInflation] is the paper's protocol (FGD.md §3): the 1213 GPU
//     nodes, the pods sorted by name and shuffled with the run seed, then
//     inflated with clones sampled with replacement until 130 % of the GPU
//     capacity has arrived; one task at a time, no departures, no retries;
//     metrics measured after every task and averaged per 1 % bin of arrived
//     workload.
//   - [ModeTimeline] replays creation and deletion times: a pod arrives at
//     its creation time, leaves at its deletion time, and waits in a FIFO
//     pending queue while nothing fits (retried whenever a pod leaves); the
//     "arrived" axis is the GPU demand in the system (running + pending).
//
// The package is pure: it reads the trace from an io.Reader or a path and
// uses no clock but for reporting wall time.
package replay
