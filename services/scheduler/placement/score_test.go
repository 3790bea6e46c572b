package placement_test

import (
	"math"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// freeNode is a trace-like node: 8 GPUs of model G2 with the given free
// milli and the given free CPU.
func freeNode(id string, cpu int64, free ...int64) placement.Node {
	n := placement.Node{ID: id, Ready: true, Zone: "z", Market: rent.OnDemand,
		CPUMilli: 96_000, MemoryMiB: 1 << 20, FreeCPUMilli: cpu, FreeMemoryMiB: 1 << 20}
	for i, f := range free {
		n.GPUs = append(n.GPUs, placement.GPU{Index: i, Model: "G2", VRAMMiB: 32 * 1024, FreeMilli: f,
			FreeVRAMMiB: 32 * 1024 * f / 1000, MaxSharers: 1000, NVLinkDomain: -1})
		if f < 1000 {
			n.GPUs[i].Sharers = 1
		}
	}
	return n
}

func workload(classes ...placement.TaskClass) *placement.Workload {
	return &placement.Workload{Classes: classes}
}

func class(cpu int64, gpus int, milli int64, w float64, models string) placement.TaskClass {
	return placement.TaskClass{TaskShape: placement.TaskShape{CPUMilli: cpu, GPUs: gpus, Milli: milli, Models: models}, Weight: w}
}

func TestNodeFragmentFollowsTheFGDDefinition(t *testing.T) {
	t.Parallel()
	n := freeNode("n", 8000, 1000, 1000, 300, 0)
	cases := []struct {
		name string
		task placement.TaskClass
		want float64
	}{
		{"a CPU-only task sees all idle GPU as fragment", class(1000, 0, 0, 1, ""), 2300},
		{"a task of another model sees all idle GPU as fragment", class(1000, 1, 500, 1, "T4|V100M16"), 2300},
		{"a fitting half-GPU task sees the GPUs too small for it", class(1000, 1, 500, 1, ""), 300},
		{"a fitting task of an allowed model sees the GPUs too small for it", class(1000, 1, 500, 1, "G2"), 300},
		{"a fitting 200-milli task sees no fragment", class(1000, 1, 200, 1, ""), 0},
		{"a two-GPU task that fits sees the partial GPU", class(1000, 2, 1000, 1, ""), 300},
		{"a four-GPU task that does not fit sees everything", class(1000, 4, 1000, 1, ""), 2300},
		{"a task short of CPU sees everything", class(9000, 1, 200, 1, ""), 2300},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := rebuild(placement.Workload{Classes: []placement.TaskClass{tc.task}})
			if got := w.NodeFragAmount(&n); got != tc.want {
				t.Fatalf("F_n(m) = %v, want %v", got, tc.want)
			}
		})
	}
	// F_n(M) is the popularity-weighted sum.
	w := rebuild(placement.Workload{Classes: []placement.TaskClass{class(1000, 0, 0, 0.25, ""), class(1000, 1, 500, 0.75, "")}})
	if got := w.NodeFragAmount(&n); got != 0.25*2300+0.75*300 {
		t.Fatalf("F_n(M) = %v, want %v", got, 0.25*2300+0.75*300)
	}
}

// rebuild routes hand-made classes through WorkloadFromCounts so their
// model lists are parsed, keeping the weights.
func rebuild(w placement.Workload) *placement.Workload {
	counts := map[placement.TaskShape]int{}
	for _, c := range w.Classes {
		counts[c.TaskShape] = int(math.Round(c.Weight * 1000))
	}
	out := placement.WorkloadFromCounts(counts, 100)
	return &out
}

func TestTargetWorkloadKeepsThePopularShapesUpTo95Percent(t *testing.T) {
	t.Parallel()
	var tasks []placement.TaskShape
	add := func(n int, s placement.TaskShape) {
		for range n {
			tasks = append(tasks, s)
		}
	}
	a := placement.TaskShape{CPUMilli: 4000, GPUs: 1, Milli: 1000}
	b := placement.TaskShape{CPUMilli: 2000, GPUs: 1, Milli: 500}
	c := placement.TaskShape{CPUMilli: 1000}
	d := placement.TaskShape{CPUMilli: 8000, GPUs: 8, Milli: 1000}
	add(60, a)
	add(30, b)
	add(6, c)
	add(4, d)
	w := placement.NewWorkload(tasks, 95)
	// 60+30 = 90 % < 95 %, +6 = 96 %: three shapes, renormalised over 96.
	if len(w.Classes) != 3 {
		t.Fatalf("want 3 classes, got %+v", w.Classes)
	}
	for i, want := range []struct {
		s placement.TaskShape
		p float64
	}{{a, 60.0 / 96}, {b, 30.0 / 96}, {c, 6.0 / 96}} {
		if w.Classes[i].TaskShape != want.s || math.Abs(w.Classes[i].Weight-want.p) > 1e-12 {
			t.Fatalf("class %d: %+v, want %+v p=%v", i, w.Classes[i], want.s, want.p)
		}
	}
}

func TestRecentRequestWindowForgetsOldShapes(t *testing.T) {
	t.Parallel()
	win := placement.NewWindow(4, 1)
	old := placement.TaskShape{GPUs: 1, Milli: 1000}
	fresh := placement.TaskShape{GPUs: 1, Milli: 250}
	for range 4 {
		win.Add(old)
	}
	for range 4 {
		win.Add(fresh)
	}
	w := win.Workload()
	if len(w.Classes) != 1 || w.Classes[0].TaskShape != fresh || w.Classes[0].Weight != 1 {
		t.Fatalf("want only the fresh shape, got %+v", w.Classes)
	}
}

func TestFGDKeepsWholeGPUsForWholeGPUWorkAndBeatsBestFitThere(t *testing.T) {
	t.Parallel()
	// The workload is mostly whole-GPU tasks with some half-GPU tasks.
	// Node A has one GPU half used; node B is empty. A 500-milli task on A's
	// half GPU leaves A's whole GPUs intact; best-fit prefers the fuller
	// node too, but FGD must also pick the half GPU inside it.
	w := rebuild(placement.Workload{Classes: []placement.TaskClass{class(1000, 1, 1000, 0.8, ""), class(1000, 1, 500, 0.2, "")}})
	a := freeNode("a", 32_000, 500, 1000, 1000, 1000)
	b := freeNode("b", 32_000, 1000, 1000, 1000, 1000)
	c := &placement.Cluster{Nodes: []placement.Node{b, a}}
	pl, _ := placement.NewPlacer(placement.Options{Policy: placement.PolicyFGD, Workload: w})
	r := req("r", fraction(500, 1024), func(r *placement.Request) { r.CPUMilli = 1000; r.MemoryMiB = 0 })
	p, err := pl.Place(c, &r)
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeID != "a" || p.GPUs[0].Index != 0 {
		t.Fatalf("FGD: want GPU 0 of node a, got %+v", p)
	}
	// A 300-milli task: FGD puts it on the half GPU too (fragment 500 →
	// 200 of a GPU no whole task can use), not on a whole GPU.
	r3 := req("r3", fraction(300, 1024), func(r *placement.Request) { r.CPUMilli = 1000; r.MemoryMiB = 0 })
	p, err = pl.Place(c, &r3)
	if err != nil || p.NodeID != "a" || p.GPUs[0].Index != 0 {
		t.Fatalf("FGD: want the 300-milli task on a's half GPU, got %+v %v", p, err)
	}
}

func TestFGDScoreIsTheSigmoidOfTheFragmentReduction(t *testing.T) {
	t.Parallel()
	w := rebuild(placement.Workload{Classes: []placement.TaskClass{class(0, 1, 1000, 1, "")}})
	n := freeNode("n", 32_000, 1000, 1000)
	// Taking 300 of a whole GPU turns 700 milli into fragment for whole
	// tasks: Δ = 0 − 700, score = int64(100·σ(−0.7)) = 33.
	got := w.ScoreFGD(&n, 0, []placement.Share{{Index: 0, Milli: 300}})
	if want := int64(100 / (1 + math.Exp(0.7))); got != want || got != 33 {
		t.Fatalf("score %d, want %d (33)", got, want)
	}
	// Taking a whole GPU leaves no fragment: Δ = 0, score 50.
	if got := w.ScoreFGD(&n, 0, []placement.Share{{Index: 0, Milli: 1000}}); got != 50 {
		t.Fatalf("whole GPU: score %d, want 50", got)
	}
}

func TestBestFitAndDotProductScoresFollowTheSimulator(t *testing.T) {
	t.Parallel()
	n := freeNode("n", 64_000, 1000, 1000, 500, 0) // R_n = 2500
	// s = ½(64000−4000)/128000 + ½(2500−1000)/8000 = 0.234375 + 0.09375
	s := 0.234375 + 0.09375
	if got, want := placement.ScoreBestFit(&n, 4000, 1000, 128_000, 8000), int64(100*(1-s)); got != want || got != 67 {
		t.Fatalf("best-fit %d, want %d", got, want)
	}
	// node·task = (0.5·4000/128000) + (2500/8000·1000/8000)
	dot := 0.5*4000.0/128000 + 2500.0/8000*1000.0/8000
	if got, want := placement.ScoreDotProduct(&n, 4000, 1000, 128_000, 8000), int64(100*(1-dot/2)); got != want {
		t.Fatalf("dot-product %d, want %d", got, want)
	}
}

func TestBestFitPicksTheFullestNodeAndTheTightestGPU(t *testing.T) {
	t.Parallel()
	full := freeNode("full", 32_000, 600, 300, 1000, 0)
	empty := freeNode("empty", 32_000, 1000, 1000, 1000, 1000)
	c := &placement.Cluster{Nodes: []placement.Node{empty, full}}
	r := req("r", fraction(250, 1024), func(r *placement.Request) { r.CPUMilli, r.MemoryMiB = 1000, 0 })
	p, err := placer(t, placement.PolicyBestFit).Place(c, &r)
	if err != nil || p.NodeID != "full" || p.GPUs[0].Index != 1 {
		t.Fatalf("want GPU 1 (300 free) of node full, got %+v %v", p, err)
	}
	p, err = placer(t, placement.PolicyFirstFit).Place(c, &r)
	if err != nil || p.NodeID != "empty" || p.GPUs[0].Index != 0 {
		t.Fatalf("first-fit: want GPU 0 of the first node, got %+v %v", p, err)
	}
}

func TestTieRankBreaksEqualScores(t *testing.T) {
	t.Parallel()
	a := with(node("a", 8), func(n *placement.Node) { n.TieRank = 2 })
	b := with(node("b", 8), func(n *placement.Node) { n.TieRank = 1 })
	r := req("r")
	for _, pol := range []placement.Policy{placement.PolicyFGD, placement.PolicyBestFit, placement.PolicyDotProduct} {
		p, err := placer(t, pol).Place(&placement.Cluster{Nodes: []placement.Node{a, b}}, &r)
		if err != nil || p.NodeID != "b" {
			t.Fatalf("%s: want the lower tie rank b, got %+v %v", pol, p, err)
		}
	}
}
