package placement_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// GPU Packing by hand (FGD.md §2.6, simulator's gpu_packing_score):
//   - idle 8-GPU node: 33 − 8 = 25; idle 2-GPU node: 33 − 2 = 31;
//   - node c (free 1000, 600, 300, 1000): a 250 fraction takes the 300 GPU
//     (tightest that fits): 100 − ⌊30/10⌋ = 97; a 500 fraction the 600 GPU:
//     100 − 6 = 94; a 700 fraction needs a free GPU: 50 − 1 = 49; one whole
//     GPU 49, two 48; a CPU-only task 0.
func TestGPUPackingScoreFollowsTheSimulator(t *testing.T) {
	t.Parallel()
	idle8 := freeNode("a", 32000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	idle2 := freeNode("b", 32000, 1000, 1000)
	c := freeNode("c", 32000, 1000, 600, 300, 1000)
	cases := []struct {
		name  string
		n     *placement.Node
		count int
		milli int64
		want  int64
	}{
		{"idle 8-GPU node", &idle8, 1, 500, 25},
		{"idle 2-GPU node", &idle2, 1, 1000, 31},
		{"fraction on the tightest shared GPU", &c, 1, 250, 97},
		{"fraction on the 600 GPU", &c, 1, 500, 94},
		{"fraction that needs a free GPU", &c, 1, 700, 49},
		{"one whole GPU on a used node", &c, 1, 1000, 49},
		{"two whole GPUs on a used node", &c, 2, 1000, 48},
		{"CPU-only task", &c, 0, 0, 0},
	}
	for _, tc := range cases {
		if got := placement.ScoreGPUPacking(tc.n, tc.count, tc.milli); got != tc.want {
			t.Errorf("%s: score %d, want %d", tc.name, got, tc.want)
		}
	}
}

// apply places a request of count GPUs × milli on the given GPUs of n.
func apply(n *placement.Node, id string, milli int64, idx ...int) {
	r := req(id, fraction(milli, 0), gpus(len(idx)))
	p := placement.Placement{NodeID: n.ID, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB}
	for _, i := range idx {
		p.GPUs = append(p.GPUs, placement.Share{Index: i, Milli: milli})
	}
	n.Apply(&r, p, t0)
}

// GPU Clustering by hand (simulator's gpu_clustering_score), fill =
// ⌊25·(8000 − R_n)/8000⌋:
//   - empty 8-GPU node: fill 0 → 25 for any GPU task;
//   - "share" node (a 300 fraction; R 7700, fill ⌊25·300/8000⌋ = 0): a
//     fraction 75, a 1-GPU task 0;
//   - "one" node (four 1-GPU tasks; R 4000, fill 12): 1-GPU 87, fraction 12;
//   - "mixed" node (a 300 fraction and a 1-GPU task; R 6700, fill
//     ⌊32500/8000⌋ = 4): fraction 54, 1-GPU 54, 2-GPU 4;
//   - empty 2-GPU node (R 2000, fill ⌊25·6000/8000⌋ = 18): 43;
//   - a CPU-only task scores 0 everywhere.
func TestGPUClusteringScoreFollowsTheSimulator(t *testing.T) {
	t.Parallel()
	all := func(id string) placement.Node {
		return freeNode(id, 64000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000)
	}
	empty, share, one, mixed := all("e"), all("s"), all("o"), all("m")
	apply(&share, "s1", 300, 0)
	for i := range 4 {
		apply(&one, "o"+string(rune('0'+i)), 1000, i)
	}
	apply(&mixed, "m1", 300, 0)
	apply(&mixed, "m2", 1000, 1)
	small := freeNode("t", 32000, 1000, 1000)
	cases := []struct {
		name  string
		n     *placement.Node
		count int
		milli int64
		want  int64
	}{
		{"empty node", &empty, 1, 500, 25},
		{"fraction on a share-only node", &share, 1, 500, 75},
		{"1-GPU task on a share-only node", &share, 1, 1000, 0},
		{"1-GPU task on a 1-GPU-only node", &one, 1, 1000, 87},
		{"fraction on a 1-GPU-only node", &one, 1, 200, 12},
		{"fraction on a mixed node", &mixed, 1, 200, 54},
		{"1-GPU task on a mixed node", &mixed, 1, 1000, 54},
		{"2-GPU task on a mixed node", &mixed, 2, 1000, 4},
		{"empty 2-GPU node", &small, 1, 1000, 43},
		{"CPU-only task", &share, 0, 0, 0},
	}
	for _, tc := range cases {
		if got := placement.ScoreGPUClustering(tc.n, tc.count, tc.milli); got != tc.want {
			t.Errorf("%s: score %d, want %d", tc.name, got, tc.want)
		}
	}
}

// Through the placer: a 250 fraction under packing goes to the node with a
// shared GPU (97 beats the idle node's 25) on its tightest GPU (300);
// under clustering a 1-GPU task goes to the 1-GPU-only node (87) rather
// than the empty one (25) or the share-only one (0).
func TestPackingAndClusteringPlacers(t *testing.T) {
	t.Parallel()
	c := &placement.Cluster{Nodes: []placement.Node{
		with(freeNode("idle", 32000, 1000, 1000, 1000, 1000), func(n *placement.Node) { n.TieRank = 0 }),
		with(freeNode("used", 32000, 1000, 600, 300, 1000), func(n *placement.Node) { n.TieRank = 1 }),
	}}
	r := req("r", fraction(250, 0))
	p, err := placer(t, placement.PolicyGPUPacking).Place(c, &r)
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeID != "used" || p.GPUs[0].Index != 2 || p.Score != 97 {
		t.Fatalf("packing: %+v, want node used GPU 2 at 97", p)
	}

	all := func(id string, rank uint64) placement.Node {
		return with(freeNode(id, 64000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000), func(n *placement.Node) { n.TieRank = rank })
	}
	empty, share, one := all("empty", 0), all("share", 1), all("one", 2)
	apply(&share, "s1", 300, 0)
	apply(&one, "o1", 1000, 0)
	c = &placement.Cluster{Nodes: []placement.Node{empty, share, one}}
	r = req("w")
	p, err = placer(t, placement.PolicyGPUClustering).Place(c, &r)
	if err != nil {
		t.Fatal(err)
	}
	// one: fill ⌊25·1000/8000⌋ = 3 → 78.
	if p.NodeID != "one" || p.Score != 78 {
		t.Fatalf("clustering: %+v, want node one at 78", p)
	}
}
