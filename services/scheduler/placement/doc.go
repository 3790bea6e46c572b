// Package placement decides where a GPU rental runs. It is pure: it imports
// neither NATS nor Redis nor the OTel SDK, takes the cluster as a plain
// [Cluster] value and the time as an argument, and seeds every random choice
// from the request id, so the same input always gives the same decision. The
// scheduler service and the trace replayer both use it.
//
// A decision is a chain written down in one place ([Place]):
//
//  1. feasibility filters, in the order of [Filters]: node ready, zone,
//     market, TEE, GPU model, GPU capabilities, host CPU and memory, and
//     finally the GPUs themselves (enough GPUs with the milli-GPU, VRAM and a
//     free sharer slot, a MIG slice, one NVLink domain when asked);
//  2. GPU choice inside each feasible node (the policy's GPU picker; NVLink
//     requests take the tightest NVLink domain that fits, other multi-GPU
//     requests the GPUs with the fewest PCIe hops between them);
//  3. ranking of the feasible nodes by the policy's score ([Policy]): fgd,
//     bestfit, firstfit, random, dotprod, fixed, packing, clustering or
//     shizu (FGD that also charges the GPU a node's free CPU can no longer
//     feed and an unrestricted task's use of a scarce GPU model, shizu.go);
//  4. selection of the highest score, ties broken by Node.TieRank and then
//     by a hash of the request and node ids.
//
// The fragmentation measure and the scores follow the definitions of the
// ATC'23 paper "Beware of Fragmentation" and its simulator exactly (see
// ../shared/notes/FGD.md): [Workload] (the fragment of a node and the FGD
// score of a placement), [FragMeter], [ScoreBestFit], [ScoreDotProduct].
//
// When nothing fits, [Shortage] says what is missing and [PlanPreemption]
// finds the cheapest set of spot rentals whose eviction makes room.
package placement
