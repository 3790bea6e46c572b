package placement_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// M = {one whole GPU: 1}. A 300-milli fraction on:
//   - a (1000, 1000): FGD Δ = 0 − 700 → int(100·σ(−0.7)) = 33;
//   - b (400, 1000):  Δ = 400 − 100 = +300 → int(100·σ(0.3)) = 57;
//   - c (700, 1000):  Δ = 700 − 400 = +300 → 57.
//
// FGD ties b and c and takes c (lower tie rank). Shizu adds 1000 for a
// shared GPU and (1000 − left)/10 for tightness: b 57+1000+90 = 1147,
// c 57+1000+60 = 1117, so b. A fraction no shared GPU can take (800) is
// placed as FGD places it.
func TestShizuPutsFractionsOnTheTightestSharedGPUAndOtherwiseFollowsFGD(t *testing.T) {
	t.Parallel()
	w := workload(class(1000, 1, 1000, 1, ""))
	c := &placement.Cluster{Nodes: []placement.Node{
		with(freeNode("a", 32000, 1000, 1000), func(n *placement.Node) { n.TieRank = 0 }),
		with(freeNode("b", 32000, 400, 1000), func(n *placement.Node) { n.TieRank = 2 }),
		with(freeNode("c", 32000, 700, 1000), func(n *placement.Node) { n.TieRank = 1 }),
	}}
	place := func(pol placement.Policy, milli int64) placement.Placement {
		pl, err := placement.NewPlacer(placement.Options{Policy: pol, Workload: w})
		if err != nil {
			t.Fatal(err)
		}
		r := req("r", fraction(milli, 0))
		p, err := pl.Place(c, &r)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := place(placement.PolicyFGD, 300); p.NodeID != "c" || p.Score != 57 || p.GPUs[0].Index != 0 {
		t.Fatalf("fgd: %+v, want node c GPU 0 at 57", p)
	}
	if p := place(placement.PolicyShizu, 300); p.NodeID != "b" || p.Score != 1147 || p.GPUs[0].Index != 0 {
		t.Fatalf("shizu: %+v, want node b GPU 0 at 1147", p)
	}
	fgd, shizu := place(placement.PolicyFGD, 800), place(placement.PolicyShizu, 800)
	if fgd.NodeID != shizu.NodeID || fgd.GPUs[0].Index != shizu.GPUs[0].Index || fgd.Score != shizu.Score {
		t.Fatalf("an 800 fraction: fgd %+v, shizu %+v, want the same", fgd, shizu)
	}
}
