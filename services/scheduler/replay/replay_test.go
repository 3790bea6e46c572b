package replay

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

func loadSlice(t *testing.T) Trace {
	t.Helper()
	tr, err := Load("testdata/openb_slice_nodes.csv", "testdata/openb_slice_pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func near(a, b float64) bool { return math.Abs(a-b) < 0.005 }

// The slice: 2 nodes × 2 P100 (capacity 4,000 milli, 64 cores each) and
// pods 0000–0005: three 1-GPU tasks (12 cores), two 460-milli tasks
// (6 cores), one CPU-only task (20 cores). M = {1×1000@12c: 1/2,
// 1×460@6c: 1/3, CPU-only@20c: 1/6}; an empty node's F_n(M) is 2000/6.
// All arrive (in this order) before any leaves; FGD's ties go to the
// node W with the lower tie rank. Event by event (used, F(M) in milli):
//
//	P0 1 GPU   → W(0,1000)            used 1000  F 166.67+333.33 = 500
//	P1 460     → W(0,540)  (tie, W)   used 1460  F 360+333.33    = 693.33
//	P2 1 GPU   → Z(0,1000)            used 2460  F 360+166.67    = 526.67
//	P3 460     → W(0,80)   (Δ +280)   used 2920  F 80+166.67     = 246.67
//	P4 1 GPU   → Z(0,0)               used 3920  F 80+0          = 80
//	P5 CPU     → W                    used 3920  F 80
//	P0 leaves  W(1000,80)             used 2920  F 246.67+0      = 246.67
//	P1 leaves  W(1000,540)            used 2460  F 526.67
//	P2 leaves  Z(1000,0)              used 1460  F 526.67+166.67 = 693.33
//	P3 leaves  W(1000,1000)           used 1000  F 333.33+166.67 = 500
//	P4 leaves  Z empty                used 0     F 666.67
//	P5 leaves                         used 0     F 666.67
//
// Demand (running + pending GPU) after each event: 1000, 1460, 2460,
// 2920, 3920, 3920, 2920, 2460, 1460, 1000, 0, 0 → levels 25, 36 (36.5
// rounds to even), 62 (61.5), 73, 98, 98, 73, 62, 36, 25, 0, 0.
func TestTimelineReplayOfATraceSliceMatchesHandComputedMetrics(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	r, err := Run(&tr, placement.PolicyFGD, 42, Options{Mode: ModeTimeline})
	if err != nil {
		t.Fatal(err)
	}
	if r.Tasks != 6 || r.Failed != 0 || r.Waited != 0 || r.FinalUsed != 0 || r.Capacity != 4000 {
		t.Fatalf("tasks %d failed %d waited %d final used %d capacity %d, want 6 0 0 0 4000", r.Tasks, r.Failed, r.Waited, r.FinalUsed, r.Capacity)
	}
	want := []struct {
		level                 int
		alloc, frag, fragRate float64
		events                int
	}{
		{0, 0, 16.667, 16.667, 2},
		{1, 0, 16.667, 16.667, 0}, // empty: its neighbour 0's events
		{24, 25, 12.5, 16.667, 0},
		{25, 25, 12.5, 16.667, 2},
		{36, 36.5, 17.333, 27.297, 2},
		{62, 61.5, 13.167, 34.199, 2},
		{73, 73, 6.167, 22.840, 2},
		{98, 98, 2, 100, 2},
	}
	for _, w := range want {
		lv, ok := r.At(w.level)
		if !ok {
			t.Fatalf("no level %d in %+v", w.level, r.Levels)
		}
		if !near(lv.Alloc, w.alloc) || !near(lv.Unalloc, 100-w.alloc) || !near(lv.Frag, w.frag) || !near(lv.FragRate, w.fragRate) || lv.Events != w.events {
			t.Errorf("level %d: got %+v, want alloc %.3f frag %.3f rate %.3f events %d", w.level, lv, w.alloc, w.frag, w.fragRate, w.events)
		}
	}
	if _, ok := r.At(30); ok {
		t.Error("level 30 has no event and no neighbour with one, want it absent")
	}
	if _, ok := r.At(99); ok {
		t.Error("levels go past the last bin with events (98), want them to stop there")
	}
}

func TestInflateShufflesTheOriginalsThenAppendsClonesUpToTheTarget(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	target := int64(1.3 * float64(tr.CapacityMilli())) // 5,200
	for seed := int64(1); seed <= 20; seed++ {
		seq, tie := Inflate(&tr, seed, 1.3)
		names := func(ps []PodSpec) []string {
			var s []string
			for _, p := range ps {
				s = append(s, p.Name)
			}
			slices.Sort(s)
			return s
		}
		if got, want := names(seq[:len(tr.Pods)]), names(tr.Pods); !slices.Equal(got, want) {
			t.Fatalf("seed %d: the first %d tasks are %v, want the originals %v", seed, len(tr.Pods), got, want)
		}
		var total int64
		for i, p := range seq {
			total += p.GPURequest()
			if i >= len(tr.Pods) && !strings.Contains(p.Name, "-clone-") {
				t.Fatalf("seed %d: task %d %s after the originals is not a clone", seed, i, p.Name)
			}
		}
		if total > target {
			t.Fatalf("seed %d: %d milli submitted, more than the target %d", seed, total, target)
		}
		if len(seq) == len(tr.Pods) {
			t.Fatalf("seed %d: no clone appended (3,920 of 5,200 milli)", seed)
		}
		p := slices.Clone(tie)
		slices.Sort(p)
		if !slices.Equal(p, []int{0, 1}) {
			t.Fatalf("seed %d: tie order %v is not a permutation of the nodes", seed, tie)
		}
		again, tie2 := Inflate(&tr, seed, 1.3)
		if !slices.EqualFunc(seq, again, func(a, b PodSpec) bool { return a.Name == b.Name }) || !slices.Equal(tie, tie2) {
			t.Fatalf("seed %d: two inflations differ", seed)
		}
	}
}

func TestInflationReplayOfASliceKeepsItsInvariants(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	for _, pol := range []placement.Policy{placement.PolicyFGD, placement.PolicyBestFit, placement.PolicyDotProduct, placement.PolicyRandom} {
		r, err := Run(&tr, pol, 7, Options{})
		if err != nil {
			t.Fatal(err)
		}
		seq, _ := Inflate(&tr, 7, DefaultTune)
		if r.Tasks != len(seq) || r.Failed == 0 || r.Failed >= r.Tasks {
			t.Fatalf("%s: %d tasks, %d failed: want all %d submitted and some (not all) failed on a 130%% load", pol, r.Tasks, r.Failed, len(seq))
		}
		if r.FinalUsed > r.Capacity {
			t.Fatalf("%s: used %d of %d", pol, r.FinalUsed, r.Capacity)
		}
		for _, lv := range r.Levels {
			if (lv.Events > 0 && lv.Alloc > float64(lv.Arrived)+0.5+1e-9) || lv.Frag < 0 || lv.FragRate > 100+1e-9 {
				t.Fatalf("%s: impossible level %+v (allocation above arrival, or fragment beyond idle)", pol, lv)
			}
		}
	}
}

// The authors' simulator, seed 42, submits 10,866 tasks on the default
// trace (FGD.md §3a): the same math/rand draws give the same sequence.
func TestInflationOfTheDefaultTraceMatchesTheAuthorsSeed42(t *testing.T) {
	t.Parallel()
	dir, err := FindTraceDir(".")
	if err != nil {
		t.Fatalf("this test reads the full trace: %v", err)
	}
	tr, err := Load(filepath.Join(dir, DefaultNodeFile), filepath.Join(dir, DefaultPodFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Nodes) != 1213 || tr.CapacityMilli() != 6_212_000 || len(tr.Pods) != 8152 {
		t.Fatalf("trace has %d nodes, %d milli-GPU, %d pods; want 1213, 6212000, 8152", len(tr.Nodes), tr.CapacityMilli(), len(tr.Pods))
	}
	seq, _ := Inflate(&tr, 42, DefaultTune)
	if len(seq) != 10_866 {
		t.Fatalf("seed 42 submits %d tasks, the authors' simulator 10866", len(seq))
	}
	if w := TargetWorkload(tr.Pods); len(w.Classes) != 35 {
		t.Fatalf("target workload has %d shapes, want 35", len(w.Classes))
	}
}

func TestTraceFilesAreParsedOrRejectedWithAClearError(t *testing.T) {
	t.Parallel()
	const podHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
	tests := []struct {
		name, pods, wantErr string
		check               func(PodSpec) bool
	}{
		{"a GPU spec lists the allowed models", podHeader + "p,1000,10,1,500,V100M16|V100M32,LS,Running,1,2,1\n", "",
			func(p PodSpec) bool { return slices.Equal(p.Models, []string{"V100M16", "V100M32"}) && p.HasTimes }},
		{"a multi-GPU task takes whole GPUs", podHeader + "p,1000,10,4,300,,LS,Running,1,2,1\n", "",
			func(p PodSpec) bool { return p.GPUMilli == 1000 && p.GPURequest() == 4000 }},
		{"milli-GPU above 1000 is clamped", podHeader + "p,1000,10,1,1200,,LS,Running,1,2,1\n", "",
			func(p PodSpec) bool { return p.GPUMilli == 1000 }},
		{"a five-column file has no times", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,0,0\n", "",
			func(p PodSpec) bool { return !p.HasTimes && p.GPUs == 0 }},
		{"a missing column is named", "name,cpu_milli,num_gpu,gpu_milli\np,1,1,1\n", "lacks column(s) [memory_mib]", nil},
		{"a non-number is named with its line", podHeader + "p,many,10,1,500,,LS,Running,1,2,1\n", "line 2: column cpu_milli", nil},
		{"a duplicate name is refused", podHeader + "p,1,10,1,500,,LS,Running,1,2,1\np,1,10,1,500,,LS,Running,1,2,1\n", "duplicate name", nil},
		{"deletion before creation is refused", podHeader + "p,1,10,1,500,,LS,Running,5,2,1\n", "deleted (2) before created (5)", nil},
		{"a task asking for nothing is refused", podHeader + "p,0,10,0,0,,LS,Running,1,2,1\n", "asks for nothing", nil},
		{"an empty file is refused", podHeader, "no pods", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pods, err := ReadPods(strings.NewReader(tt.pods))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(pods) != 1 || !tt.check(pods[0]) {
				t.Fatalf("got %+v, %v", pods, err)
			}
		})
	}
	if _, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn,1000,10,2,\n")); err == nil || !strings.Contains(err.Error(), "has GPUs but no model") {
		t.Fatalf("a GPU node without a model: got %v", err)
	}
}

func TestTheTraceFolderIsFoundBesideTheRepositoryOrNamedWhenMissing(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "main", "services", "scheduler")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHIZU_TRACE_DIR", "")
	if _, err := FindTraceDir(repo); err == nil || !strings.Contains(err.Error(), "trace folder not found") ||
		!strings.Contains(err.Error(), filepath.Join(root, "shared", TraceDirName)) {
		t.Fatalf("got %v, want an error naming %s", err, filepath.Join(root, "shared", TraceDirName))
	}
	want := filepath.Join(root, "shared", TraceDirName)
	if err := os.MkdirAll(filepath.Join(want, "csv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(want, DefaultNodeFile), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := FindTraceDir(repo); err != nil || got != want {
		t.Fatalf("got %q, %v, want %q", got, err, want)
	}
}

func TestSummariesGiveMedianMeanAndSpreadOverSeeds(t *testing.T) {
	t.Parallel()
	mk := func(seed int64, unalloc float64) Result {
		return Result{Policy: "fgd", Seed: seed, Tasks: 10, Failed: int(seed), Levels: []Level{{Arrived: 100, Alloc: 100 - unalloc, Unalloc: unalloc}}}
	}
	s := Summarise([]Result{mk(1, 4), mk(2, 6), mk(3, 5), mk(4, 9)})
	lv, ok := s.Level(100)
	if !ok || lv.Unalloc.Median != 5.5 || lv.Unalloc.Mean != 6 || lv.Unalloc.Min != 4 || lv.Unalloc.Max != 9 || !near(lv.Unalloc.SD, math.Sqrt(14.0/3)) || lv.Seeds != 4 {
		t.Fatalf("got %+v", lv)
	}
	if s.Failed.Mean != 2.5 || !slices.Equal(s.Seeds, []int64{1, 2, 3, 4}) {
		t.Fatalf("got %+v", s)
	}
}

func TestExecuteRunsEveryPolicyAndSeedInParallel(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	var calls int
	sums, runs, err := Execute(context.Background(), &tr, Plan{
		Policies: []placement.Policy{placement.PolicyFGD, placement.PolicyBestFit},
		Seeds:    Seeds(1, 3), Workers: 3,
		Progress: func(done, total int, _ Result) {
			calls++
			if total != 6 || done != calls {
				t.Errorf("progress %d/%d after %d calls", done, total, calls)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 6 || len(sums) != 2 || sums[1].Policy != "bestfit" || len(runs[0]) != 3 || !slices.Equal(sums[0].Seeds, []int64{1, 2, 3}) {
		t.Fatalf("calls %d, summaries %+v", calls, sums)
	}
	for si, seed := range []int64{1, 2, 3} {
		one, err := Run(&tr, placement.PolicyBestFit, seed, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if runs[1][si].Failed != one.Failed || !slices.Equal(levelsOf(runs[1][si]), levelsOf(one)) {
			t.Fatalf("seed %d: the parallel run differs from a lone run", seed)
		}
	}
	if _, _, err := Execute(context.Background(), &tr, Plan{Seeds: Seeds(1, 1)}); err == nil {
		t.Fatal("a plan without policies ran")
	}
}

func levelsOf(r Result) []Level { return r.Levels }

func TestTimelineModeRefusesATraceWithoutTimes(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	tr.Pods[3].HasTimes = false
	if _, err := Run(&tr, placement.PolicyFGD, 1, Options{Mode: ModeTimeline}); err == nil || !strings.Contains(err.Error(), "creation_time") {
		t.Fatalf("got %v", err)
	}
	if _, err := ParseMode("replay"); err == nil {
		t.Fatal("an unknown mode parsed")
	}
}

func TestReportsCarryEveryPolicyAsTableJSONAndSVG(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	sums, _, err := Execute(context.Background(), &tr, Plan{Policies: []placement.Policy{placement.PolicyFGD, placement.PolicyRandom}, Seeds: Seeds(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	var table, js, svg strings.Builder
	if err := WriteTable(&table, sums); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&js, Report{Mode: "inflation", Policies: sums}); err != nil {
		t.Fatal(err)
	}
	if err := WriteSVG(&svg, "slice <test>", sums); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fgd", "random", "100%", "unalloc min-max"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if !strings.Contains(js.String(), `"unalloc_pct"`) || !strings.Contains(js.String(), `"policy": "random"`) {
		t.Errorf("json lacks the levels or a policy:\n%s", js.String())
	}
	if strings.Count(svg.String(), "<polyline") != 3 || !strings.Contains(svg.String(), "slice &lt;test&gt;") {
		t.Errorf("svg wants one line per policy plus the ideal, and an escaped title:\n%s", svg.String())
	}
}

func TestATaskDeletedTheSecondItArrivesComesAndGoes(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	tr.Pods[0].Deleted = tr.Pods[0].Created
	r, err := Run(&tr, placement.PolicyFGD, 42, Options{Mode: ModeTimeline})
	if err != nil {
		t.Fatal(err)
	}
	if r.FinalUsed != 0 || r.Failed != 0 || r.Tasks != 6 {
		t.Fatalf("final used %d, failed %d, tasks %d: want the zero-lifetime task placed and gone", r.FinalUsed, r.Failed, r.Tasks)
	}
}

// The slice with its CPU-only task P5 turned into a whole-GPU task: when
// it arrives every GPU is taken (W 0+80, Z 0+0), so it waits until P0
// leaves and then runs; if it is deleted before that, it never ran.
func TestATaskThatFindsNoRoomWaitsForADeparture(t *testing.T) {
	t.Parallel()
	tr := loadSlice(t)
	p5 := &tr.Pods[5]
	p5.CPUMilli, p5.GPUs, p5.GPUMilli = 12000, 1, 1000
	r, err := Run(&tr, placement.PolicyFGD, 42, Options{Mode: ModeTimeline})
	if err != nil {
		t.Fatal(err)
	}
	if r.Waited != 1 || r.Failed != 0 || r.FinalUsed != 0 {
		t.Fatalf("waited %d failed %d final used %d, want 1 0 0", r.Waited, r.Failed, r.FinalUsed)
	}
	// While it waits the demand is 4920 of 4000 (123 %) with 3920 used.
	if lv, ok := r.At(123); !ok || !near(lv.Alloc, 98) {
		t.Fatalf("level 123: %+v, %v", lv, ok)
	}
	p5.Deleted = tr.Pods[0].Deleted - 1
	r, err = Run(&tr, placement.PolicyFGD, 42, Options{Mode: ModeTimeline})
	if err != nil {
		t.Fatal(err)
	}
	if r.Waited != 1 || r.Failed != 1 {
		t.Fatalf("waited %d failed %d, want 1 1 (left while pending)", r.Waited, r.Failed)
	}
}
