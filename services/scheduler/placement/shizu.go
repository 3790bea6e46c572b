package placement

import "slices"

// Shizu's policy (PolicyShizu) is FGD with two costs FGD's one-task-at-a-
// time measure does not see, both found on the Alibaba trace
// (docs/replay.md):
//
//   - CPU. FGD counts a node's idle GPU as fragment for a task shape only
//     once the node's free CPU is below that shape's request, so it fills
//     CPU-poor nodes (G2: 12 cores per GPU, against 13 cores per GPU the
//     trace asks for) with CPU-heavy tasks and leaves GPUs nobody can feed.
//     Shizu charges the growth of the node's CPU-stranded GPU: the idle
//     milli-GPU its free CPU cannot feed at the node's own CPU:GPU ratio,
//     max(0, R_n − c_n·G_n·1000/C_n), weighted by shizuCPUWeight.
//   - Scarce models. FGD lets a task that runs anywhere take a GPU of a
//     model that tasks restricted to it need. Shizu charges an unrestricted
//     task, per milli-GPU it takes on model X, X's scarcity:
//     min(1, D_X·Cap/Cap_X), where D_X is the share of the target
//     workload's GPU demand restricted to X (a shape allowed on k models
//     counts 1/k towards each) and Cap_X/Cap is X's share of the cluster.
//
// Δ_shizu = Δ_FGD − shizuCPUWeight·(stranded after − stranded before) −
// scarcity_X·milli, and the score is FGD's int64(100·sigmoid(Δ/1000)), so
// ties still fall to the seeded node order. Inside a node the GPU with the
// highest score wins (first index on ties), as in FGD.

// shizuCPUWeight weighs the CPU-stranded milli-GPU against FGD's Δ.
const shizuCPUWeight = 0.3

// shizuScratch is what the Shizu score needs of the request and cluster.
type shizuScratch struct {
	// unrestricted is true when the request may run on any model.
	unrestricted bool
	// scarcity of each model (0..1) under the target workload; nil when no
	// shape of the workload is restricted to a model.
	scarcity map[string]float64
	caps     []modelCap
}

type modelCap struct {
	model string
	milli int64
}

// observe prepares the scarcity of each model for request r in cluster c
// under workload w.
func (sh *shizuScratch) observe(c *Cluster, r *Request, w *Workload) {
	sh.unrestricted = len(r.Models) == 0
	sh.scarcity = nil
	if !sh.unrestricted {
		return
	}
	demand := modelDemand(w)
	if len(demand) == 0 {
		return
	}
	sh.caps = sh.caps[:0]
	var capAll int64
	last := -1
	for i := range c.Nodes {
		n := &c.Nodes[i]
		g := int64(len(n.GPUs)) * MilliPerGPU
		if g == 0 {
			continue
		}
		m := n.model()
		if last < 0 || sh.caps[last].model != m {
			last = slices.IndexFunc(sh.caps, func(mc modelCap) bool { return mc.model == m })
			if last < 0 {
				sh.caps = append(sh.caps, modelCap{model: m})
				last = len(sh.caps) - 1
			}
		}
		sh.caps[last].milli += g
		capAll += g
	}
	sh.scarcity = make(map[string]float64, len(demand))
	for _, mc := range sh.caps {
		if d := demand[mc.model]; d > 0 {
			sh.scarcity[mc.model] = min(1, d*float64(capAll)/float64(mc.milli))
		}
	}
}

// modelDemand is D_X for each model X named by a restricted shape of w:
// the share of w's GPU demand restricted to X.
func modelDemand(w *Workload) map[string]float64 {
	var all float64
	d := map[string]float64{}
	for i := range w.Classes {
		m := &w.Classes[i]
		g := m.Weight * float64(int64(m.GPUs)*m.Milli)
		all += g
		for _, x := range m.models {
			d[x] += g / float64(len(m.models))
		}
	}
	if all <= 0 {
		return nil
	}
	for x := range d {
		d[x] /= all
	}
	return d
}

// cpuStranded is the idle milli-GPU r that free CPU c cannot feed at the
// node's own ratio of capC CPU to capG milli-GPU.
func cpuStranded(c, r, capC, capG int64) float64 {
	return max(0, float64(r)-float64(c)*float64(capG)/float64(capC))
}

// delta is Δ_shizu of taking cpu and shares from prepared node n.
func (sh *shizuScratch) delta(fgdDelta float64, n *Node, cpu int64, shares []Share) float64 {
	d := fgdDelta
	var r, taken int64
	for g := range n.GPUs {
		r += n.GPUs[g].FreeMilli
	}
	for _, s := range shares {
		taken += s.Milli
	}
	if capG := int64(len(n.GPUs)) * MilliPerGPU; capG > 0 && n.CPUMilli > 0 {
		grown := cpuStranded(n.FreeCPUMilli-cpu, r-taken, n.CPUMilli, capG) - cpuStranded(n.FreeCPUMilli, r, n.CPUMilli, capG)
		d -= shizuCPUWeight * grown
	}
	if sh.unrestricted && taken > 0 {
		d -= sh.scarcity[n.model()] * float64(taken)
	}
	return d
}

// fragScore is the fragmentation-aware score of taking cpu and shares from
// node n, prepared in p.fgd, under the placer's policy: FGD's or Shizu's.
func (p *Placer) fragScore(w *Workload, n *Node, cpu int64, shares []Share) int64 {
	d := w.deltaAfter(n, &p.fgd, cpu, shares)
	if p.opts.Policy == PolicyShizu {
		d = p.shizu.delta(d, n, cpu, shares)
	}
	return fgdScore(d)
}
