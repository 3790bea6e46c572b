package placement

import "slices"

// The FGD paper's packing baselines (shared/notes/FGD.md §2.6): GPU Packing
// and GPU Clustering. Both pick the GPU inside a node as best-fit does (the
// tightest GPU that fits), and both score CPU-only requests 0 on every
// node, leaving them to the tie order.
const (
	// PolicyGPUPacking prefers already-shared GPUs, then whole GPUs of
	// nodes already in use, then idle nodes.
	PolicyGPUPacking Policy = "packing"
	// PolicyGPUClustering prefers nodes whose GPU tasks are of the same
	// request class (share-gpu, 1-gpu, 2-gpu, ...), fuller nodes first.
	PolicyGPUClustering Policy = "clustering"
)

// maxNodeScore is the kube-scheduler's MaxNodeScore the baselines scale to.
const maxNodeScore = 100

// packingNormMilli is the simulator's MaxSpecGpu: 8 GPUs.
const packingNormMilli = 8 * MilliPerGPU

// ScoreGPUPacking is the GPU Packing score (simulator's gpu_packing_score)
// of a request for count GPUs of milli each on node n, or 0 when none fits:
//   - every GPU of the node is free: 33 − G_n, at least G_n;
//   - the request needs k fully free GPUs (taking the tightest GPUs that
//     fit, least free first): 50 − k, at least 33;
//   - it fits on already-used GPUs: 100 − Σ(⌊free·100/1000⌋)/10 over the
//     GPUs it takes, at least 50.
//
// A CPU-only request (count 0) scores 0.
func ScoreGPUPacking(n *Node, count int, milli int64) int64 {
	if count == 0 || milli <= 0 {
		return 0
	}
	fullyFree := 0
	for i := range n.GPUs {
		if n.GPUs[i].FreeMilli == MilliPerGPU {
			fullyFree++
		}
	}
	if fullyFree == len(n.GPUs) {
		return max(maxNodeScore/3-int64(fullyFree), int64(fullyFree))
	}
	free := make([]int64, 0, len(n.GPUs))
	for i := range n.GPUs {
		free = append(free, n.GPUs[i].FreeMilli)
	}
	slices.Sort(free)
	need, wholeUsed := count, 0
	var pct int64
	for _, f := range free {
		if need == 0 {
			break
		}
		if f >= milli {
			need--
			pct += f * 100 / MilliPerGPU
			if f == MilliPerGPU {
				wholeUsed++
			}
		}
	}
	if need > 0 {
		return 0
	}
	if wholeUsed > 0 {
		return max(maxNodeScore/2-int64(wholeUsed), maxNodeScore/3)
	}
	return max(maxNodeScore-pct/10, maxNodeScore/2)
}

// gpuClass is a request's class for GPU Clustering: "" for CPU-only,
// "share" for a fraction of one GPU, else the GPU count.
func gpuClass(count int, milli int64) int {
	switch {
	case count == 0:
		return 0
	case count == 1 && milli < MilliPerGPU:
		return -1 // share-gpu
	default:
		return count
	}
}

// ScoreGPUClustering is the GPU Clustering score (simulator's
// gpu_clustering_score) of a request for count GPUs of milli each on node
// n. With fill = ⌊25·(8000 − R_n)/8000⌋ (R_n the node's idle milli-GPU):
//   - the node's GPU tasks are all of the request's class: 75 + fill;
//   - they include that class and others: 50 + fill;
//   - the node has no GPU task: 25 + fill;
//   - it has only other classes: fill.
//
// A CPU-only request scores 0. The classes are read from n.Allocations.
func ScoreGPUClustering(n *Node, count int, milli int64) int64 {
	want := gpuClass(count, milli)
	if want == 0 {
		return 0
	}
	same, other := false, false
	for _, a := range n.Allocations {
		if len(a.GPUs) == 0 {
			continue
		}
		if gpuClass(len(a.GPUs), a.GPUs[0].Milli) == want {
			same = true
		} else {
			other = true
		}
	}
	fill := maxNodeScore / 4 * (packingNormMilli - n.freeMilli()) / packingNormMilli
	switch {
	case same && !other:
		return fill + maxNodeScore*3/4
	case same:
		return fill + maxNodeScore*2/4
	case !other:
		return fill + maxNodeScore/4
	default:
		return fill
	}
}

// rankBaseline scores the candidates under GPU Packing or GPU Clustering.
func (p *Placer) rankBaseline(c *Cluster, s *shape) {
	score := ScoreGPUPacking
	if p.opts.Policy == PolicyGPUClustering {
		score = ScoreGPUClustering
	}
	for i := range p.cands {
		cd := &p.cands[i]
		cd.score = score(&c.Nodes[cd.node], s.count, s.milli)
	}
}
