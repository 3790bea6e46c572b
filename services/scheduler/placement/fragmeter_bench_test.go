package placement_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// BenchmarkFragMeterUpdate is the live gauge's cost per placement: one
// FragMeter.Update of the node a placement changed, on a 1,000-node ×
// 8-GPU cluster under a trace-like workload. It reports ns/update next to
// an FGD decision (64 candidates, as the service runs) measured in the same
// run, and their ratio.
//
//	go test -run '^$' -bench FragMeterUpdate ./services/scheduler/placement/
func BenchmarkFragMeterUpdate(b *testing.B) {
	c := &placement.Cluster{}
	for i := range 1000 {
		c.Nodes = append(c.Nodes, node(fmt.Sprintf("node-%04d", i), 8))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var shapes []placement.TaskShape
	for i := range 2000 {
		r := benchRequest(rng, i)
		shapes = append(shapes, placement.ShapeOf(&r))
	}
	w := placement.NewWorkload(shapes, placement.DefaultCoveragePct)
	// Fill the cluster to about half with random fractions.
	for i := range c.Nodes {
		for g := range c.Nodes[i].GPUs {
			c.Nodes[i].GPUs[g].FreeMilli = int64(rng.IntN(11)) * 100
		}
	}
	var m placement.FragMeter
	m.Reset(c, w)
	pl, err := placement.NewPlacer(placement.Options{Policy: placement.PolicyFGD, Workload: &w, MaxCandidates: 64})
	if err != nil {
		b.Fatal(err)
	}
	const decisions = 2000
	r := req("probe", fraction(300, 1024))
	start := b.Elapsed()
	for i := range decisions {
		r.ID = fmt.Sprintf("probe-%d", i)
		if _, err := pl.Place(c, &r); err != nil {
			b.Fatal(err)
		}
	}
	perDecision := float64(b.Elapsed()-start) / decisions
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := i % len(c.Nodes)
		g := &c.Nodes[k].GPUs[i%8]
		g.FreeMilli = 1000 - g.FreeMilli
		m.Update(c, k)
	}
	perUpdate := float64(b.Elapsed()) / float64(b.N)
	b.ReportMetric(perUpdate, "ns/update")
	b.ReportMetric(perDecision, "ns/decision")
	b.ReportMetric(perUpdate/perDecision, "update/decision")
}
