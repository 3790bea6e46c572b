package placement_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// Two 2-GPU nodes (64 cores), M = {1 GPU @12 cores: ½, 460 milli @6 cores:
// ⅓, CPU-only @20 cores: ⅙}. Node A (0, 540 free, 46 cores):
// F = ½·540 (no whole GPU) + ⅓·0 (540 fits 460) + ⅙·540 = 360; node B
// empty: ⅙·2000 = 333.33. I = 2540 of 4000.
func TestFragMeterMatchesAHandComputedCluster(t *testing.T) {
	t.Parallel()
	w := placement.Workload{Classes: []placement.TaskClass{
		{TaskShape: placement.TaskShape{CPUMilli: 12000, GPUs: 1, Milli: 1000}, Weight: 0.5},
		{TaskShape: placement.TaskShape{CPUMilli: 6000, GPUs: 1, Milli: 460}, Weight: 1.0 / 3},
		{TaskShape: placement.TaskShape{CPUMilli: 20000}, Weight: 1.0 / 6},
	}}
	node := func(id string, cpu int64, free ...int64) placement.Node {
		n := placement.Node{ID: id, Ready: true, CPUMilli: 64000, FreeCPUMilli: cpu, MemoryMiB: 1 << 20, FreeMemoryMiB: 1 << 20}
		for i, f := range free {
			n.GPUs = append(n.GPUs, placement.GPU{Index: i, FreeMilli: f, Model: "P100", VRAMMiB: 16384, FreeVRAMMiB: 16384, NVLinkDomain: -1})
		}
		return n
	}
	c := &placement.Cluster{Nodes: []placement.Node{node("a", 46000, 0, 540), node("b", 64000, 1000, 1000)}}
	var m placement.FragMeter
	m.Reset(c, w)
	st := m.Stats()
	if math.Abs(st.FragMilli-(360+2000.0/6)) > 1e-9 || st.IdleMilli != 2540 || st.CapacityMilli != 4000 {
		t.Fatalf("got %+v, want F 693.33, I 2540, capacity 4000", st)
	}
	if math.Abs(st.AmountPct()-17.3333) > 1e-3 || math.Abs(st.RatePct()-27.2966) > 1e-3 || math.Abs(st.AllocationPct()-36.5) > 1e-9 {
		t.Fatalf("amount %.4f rate %.4f alloc %.4f", st.AmountPct(), st.RatePct(), st.AllocationPct())
	}
	// A 460 task on A's second GPU: A (0, 80) → every class sees 80 as
	// fragment: F_A = 80.
	c.Nodes[0].GPUs[1].FreeMilli = 80
	c.Nodes[0].FreeCPUMilli = 40000
	m.Update(c, 0)
	if st := m.Stats(); math.Abs(st.FragMilli-(80+2000.0/6)) > 1e-9 || st.IdleMilli != 2080 {
		t.Fatalf("after the update got %+v, want F 413.33, I 2080", st)
	}
	// An appended node counts from then on.
	c.Nodes = append(c.Nodes, node("c", 64000, 1000))
	m.Update(c, 2)
	if st := m.Stats(); st.CapacityMilli != 5000 || st.IdleMilli != 3080 {
		t.Fatalf("after appending got %+v", st)
	}
}

// However the cluster changes, the incremental measure equals a full one.
func TestFragMeterStaysEqualToAFullMeasure(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var shapes []placement.TaskShape
	for range 500 {
		shapes = append(shapes, placement.TaskShape{CPUMilli: int64(rng.IntN(16)) * 1000, GPUs: 1, Milli: []int64{200, 500, 1000}[rng.IntN(3)]})
	}
	w := placement.NewWorkload(shapes, placement.DefaultCoveragePct)
	c := &placement.Cluster{}
	for i := range 20 {
		n := placement.Node{ID: string(rune('a' + i)), Ready: true, CPUMilli: 64000, FreeCPUMilli: 64000}
		for g := range 4 {
			n.GPUs = append(n.GPUs, placement.GPU{Index: g, FreeMilli: 1000})
		}
		c.Nodes = append(c.Nodes, n)
	}
	var m placement.FragMeter
	m.Reset(c, w)
	for range 2000 {
		i := rng.IntN(len(c.Nodes))
		n := &c.Nodes[i]
		n.GPUs[rng.IntN(4)].FreeMilli = int64(rng.IntN(11)) * 100
		n.FreeCPUMilli = int64(rng.IntN(65)) * 1000
		m.Update(c, i)
	}
	full, idle := w.ClusterFrag(c)
	if st := m.Stats(); math.Abs(st.FragMilli-full) > 1e-6 || st.IdleMilli != idle {
		t.Fatalf("incremental %+v, full F %.3f I %d", st, full, idle)
	}
}
