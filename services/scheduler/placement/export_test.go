package placement

// What only the tests measure: FGD's and Shizu's formulas one node at a
// time, exposed to package placement_test.

// NodeFragAmount is F_n(M), the expected fragment of node n in milli-GPU
// under the target workload.
func (w *Workload) NodeFragAmount(n *Node) float64 {
	return w.frag(stateOf(n, make([]int64, 0, len(n.GPUs))))
}

// ClusterFrag is F(M) summed over the cluster and the idle milli-GPU I; the
// fragmentation rate is 100·F/I %.
func (w *Workload) ClusterFrag(c *Cluster) (frag float64, idle int64) {
	buf := make([]int64, 0, 16)
	for i := range c.Nodes {
		s := stateOf(&c.Nodes[i], buf)
		frag += w.frag(s)
		for _, f := range s.free {
			idle += f
		}
	}
	return frag, idle
}

// ScoreFGD scores placing shares (CPU cpu) on node n: the less the node's
// fragmentation grows, the higher (0..100).
func (w *Workload) ScoreFGD(n *Node, cpu int64, shares []Share) int64 {
	var sc fgdScratch
	w.prepare(n, &sc)
	return fgdScore(w.deltaAfter(n, &sc, cpu, shares))
}

// AmountPct is the fragment as a share of GPU capacity (%).
func (s FragStats) AmountPct() float64 {
	if s.CapacityMilli <= 0 {
		return 0
	}
	return 100 * s.FragMilli / float64(s.CapacityMilli)
}

// ShizuScore is the Shizu score of placing shares (and cpu) on node n of
// cluster c for request r under workload w: FGD's
// int64(100·sigmoid(Δ_shizu/1000)).
func (w *Workload) ShizuScore(c *Cluster, r *Request, n *Node, cpu int64, shares []Share) int64 {
	var sh shizuScratch
	sh.observe(c, r, w)
	var sc fgdScratch
	w.prepare(n, &sc)
	return fgdScore(sh.delta(w.deltaAfter(n, &sc, cpu, shares), n, cpu, shares))
}
