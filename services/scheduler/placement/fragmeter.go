package placement

// FragMeter keeps the fragmentation measure of a cluster (FGD.md §2:
// F(M) = Σ_n F_n(M), the idle milli-GPU I and the capacity) up to date
// node by node: Update after a node changes costs O(classes × GPUs of that
// node), not a pass over the cluster. The scheduler exports it as gauges;
// the trace replayer reports the same numbers. Not safe for concurrent use.
type FragMeter struct {
	w     Workload
	frag  []float64
	idle  []int64
	cap   []int64
	total float64
	// idleSum and capSum are Σ idle and Σ capacity (milli-GPU).
	idleSum, capSum int64
	buf             []int64
}

// FragStats is the measure at one moment, in milli-GPU.
type FragStats struct {
	FragMilli     float64
	IdleMilli     int64
	CapacityMilli int64
}

// RatePct is the fragment as a share of idle GPU (%), 0 when nothing is idle.
func (s FragStats) RatePct() float64 {
	if s.IdleMilli <= 0 {
		return 0
	}
	return 100 * s.FragMilli / float64(s.IdleMilli)
}

// AllocationPct is the allocated share of GPU capacity (%).
func (s FragStats) AllocationPct() float64 {
	if s.CapacityMilli <= 0 {
		return 0
	}
	return 100 * float64(s.CapacityMilli-s.IdleMilli) / float64(s.CapacityMilli)
}

// Reset measures every node of c against workload w (copied).
func (m *FragMeter) Reset(c *Cluster, w Workload) {
	m.w = w
	m.frag, m.idle, m.cap = m.frag[:0], m.idle[:0], m.cap[:0]
	m.total, m.idleSum, m.capSum = 0, 0, 0
	for i := range c.Nodes {
		m.Update(c, i)
	}
}

// Update re-measures node i of c after it changed (or was appended).
func (m *FragMeter) Update(c *Cluster, i int) {
	for len(m.frag) <= i {
		m.frag, m.idle, m.cap = append(m.frag, 0), append(m.idle, 0), append(m.cap, 0)
	}
	n := &c.Nodes[i]
	s := stateOf(n, m.buf)
	m.buf = s.free[:0]
	var f float64
	if len(m.w.Classes) > 0 {
		f = m.w.frag(s)
	}
	var idle int64
	for _, x := range s.free {
		idle += x
	}
	capacity := int64(len(n.GPUs)) * MilliPerGPU
	m.total += f - m.frag[i]
	m.idleSum += idle - m.idle[i]
	m.capSum += capacity - m.cap[i]
	m.frag[i], m.idle[i], m.cap[i] = f, idle, capacity
}

// Stats returns the current measure.
func (m *FragMeter) Stats() FragStats {
	return FragStats{FragMilli: m.total, IdleMilli: m.idleSum, CapacityMilli: m.capSum}
}
