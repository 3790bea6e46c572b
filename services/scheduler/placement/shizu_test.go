package placement_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// CPU by hand. M = {one whole GPU, 1 core}. A one-GPU task asking 12 cores:
//   - node a (2 GPUs, 16 cores, all free): FGD Δ = 0 (the shape still fits
//     after) → 50. CPU-stranded GPU at a's ratio (8 cores per GPU): before
//     max(0, 2000 − 16000·2000/16000) = 0, after max(0, 1000 −
//     4000·2000/16000) = 500; Δ_shizu = 0 − 0.3·500 = −150 → int(100·σ(−0.15))
//     = 46.
//   - node c (2 GPUs, 64 cores): after, 52 cores feed 1625 milli > 1000
//     idle: nothing stranded, Δ_shizu = 0 → 50.
//
// FGD ties a and c and takes a (lower tie rank); Shizu takes c.
func TestShizuChargesGPUsLeftWithoutCPU(t *testing.T) {
	t.Parallel()
	w := workload(class(1000, 1, 1000, 1, ""))
	a := with(freeNode("a", 16000, 1000, 1000), func(n *placement.Node) { n.CPUMilli, n.TieRank = 16000, 0 })
	cn := with(freeNode("c", 64000, 1000, 1000), func(n *placement.Node) { n.CPUMilli, n.TieRank = 64000, 1 })
	c := &placement.Cluster{Nodes: []placement.Node{a, cn}}
	r := req("r", func(r *placement.Request) { r.CPUMilli = 12000 })
	one := []placement.Share{{Index: 0, Milli: 1000}}
	if got := w.ShizuScore(c, &r, &c.Nodes[0], r.CPUMilli, one); got != 46 {
		t.Fatalf("shizu score on a = %d, want 46", got)
	}
	if got := w.ShizuScore(c, &r, &c.Nodes[1], r.CPUMilli, one); got != 50 {
		t.Fatalf("shizu score on c = %d, want 50", got)
	}
	place := func(pol placement.Policy) placement.Placement {
		pl, err := placement.NewPlacer(placement.Options{Policy: pol, Workload: w})
		if err != nil {
			t.Fatal(err)
		}
		p, err := pl.Place(c, &r)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := place(placement.PolicyFGD); p.NodeID != "a" || p.Score != 50 {
		t.Fatalf("fgd: %+v, want node a at 50", p)
	}
	if p := place(placement.PolicyShizu); p.NodeID != "c" || p.Score != 50 {
		t.Fatalf("shizu: %+v, want node c at 50", p)
	}
}

// Scarce models by hand. M = {one whole GPU anywhere: ½, one whole T4: ½};
// cluster: node g (2 G2 GPUs) and node t (2 T4 GPUs), 96 cores each. D_T4 =
// (½·1000)/(½·1000 + ½·1000) = ½; T4 holds 2000 of 4000 milli, so its
// scarcity is min(1, ½·4000/2000) = 1, and G2's is 0 (no shape is
// restricted to it). A one-GPU task (1 core) that runs anywhere:
//   - on t: FGD Δ = 0 → 50; Δ_shizu = 0 − 1·1000 → int(100·σ(−1)) = 26;
//   - on g: FGD Δ = ½·(2000 − 1000) (the T4 shape sees g's idle GPU as
//     fragment) = 500 → 62 under both.
//
// The same task restricted to T4 is not charged: 50 on t.
func TestShizuChargesUnrestrictedTasksForScarceModels(t *testing.T) {
	t.Parallel()
	w := rebuild(placement.Workload{Classes: []placement.TaskClass{class(1000, 1, 1000, 0.5, ""), class(1000, 1, 1000, 0.5, "T4")}})
	g := freeNode("g", 96000, 1000, 1000)
	tn := with(freeNode("t", 96000, 1000, 1000), func(n *placement.Node) {
		for i := range n.GPUs {
			n.GPUs[i].Model = "T4"
		}
	})
	c := &placement.Cluster{Nodes: []placement.Node{g, tn}}
	r := req("r", func(r *placement.Request) { r.CPUMilli = 1000 })
	one := []placement.Share{{Index: 0, Milli: 1000}}
	cases := []struct {
		name       string
		node       int
		models     []string
		fgd, shizu int64
	}{
		{"unrestricted on T4", 1, nil, 50, 26},
		{"unrestricted on G2", 0, nil, 62, 62},
		{"restricted to T4 on T4", 1, []string{"T4"}, 50, 50},
	}
	for _, tc := range cases {
		r.Models = tc.models
		n := &c.Nodes[tc.node]
		if got := w.ScoreFGD(n, r.CPUMilli, one); got != tc.fgd {
			t.Errorf("%s: fgd %d, want %d", tc.name, got, tc.fgd)
		}
		if got := w.ShizuScore(c, &r, n, r.CPUMilli, one); got != tc.shizu {
			t.Errorf("%s: shizu %d, want %d", tc.name, got, tc.shizu)
		}
	}
}
