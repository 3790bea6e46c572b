package benchkit_test

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/benchkit"
	"github.com/shizu-gpu/shizu/shared/benchkit/benchtest"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestFinishJudgesTheValueAgainstTheGoal(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         benchkit.Result
		wantRatio float64
		wantPass  bool
	}{
		{"a rate at its goal passes", benchkit.Result{Value: 10, Ceiling: 20, Goal: 10}, 0.5, true},
		{"a rate under its goal fails", benchkit.Result{Value: 9, Ceiling: 18, Goal: 10}, 0.5, false},
		{"a latency under its bound passes", benchkit.Result{Value: 5, Ceiling: 1, Goal: 100, AtMost: true}, 5, true},
		{"a latency at its bound fails", benchkit.Result{Value: 100, Ceiling: 50, Goal: 100, AtMost: true}, 2, false},
		{"no ceiling leaves the ratio zero", benchkit.Result{Value: 10, Goal: 1}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.Finish()
			if tc.r.Ratio != tc.wantRatio || tc.r.Pass != tc.wantPass {
				t.Fatalf("ratio %v pass %v, want %v %v", tc.r.Ratio, tc.r.Pass, tc.wantRatio, tc.wantPass)
			}
		})
	}
}

func TestPercentileMSIndexesTheSortedDurations(t *testing.T) {
	ds := []time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0, 1}, {0.5, 3}, {0.99, 4}, {1, 4}} {
		if got := benchkit.PercentileMS(ds, tc.q); got != tc.want {
			t.Errorf("q %v: %v ms, want %v", tc.q, got, tc.want)
		}
	}
	if got := benchkit.PercentileMS(nil, 0.5); got != 0 {
		t.Errorf("no durations: %v, want 0", got)
	}
	if ds[0] != 4*time.Millisecond {
		t.Error("PercentileMS sorted its argument")
	}
}

// TestCeilingsMeasureOnRealServers checks every ceiling returns a positive
// figure at a tiny size (not its speed).
func TestCeilingsMeasureOnRealServers(t *testing.T) {
	env := benchtest.Env(t)
	ctx := t.Context()
	if r, err := env.ReserveCeiling(ctx, 4, 40); err != nil || r <= 0 {
		t.Fatalf("reserve ceiling %v, %v", r, err)
	}
	if r, err := env.PublishCeiling(ctx, 40); err != nil || r <= 0 {
		t.Fatalf("publish ceiling %v, %v", r, err)
	}
	subj, _ := subject.Format(subject.ScaleDecided, "bench-ceiling")
	probe, err := env.NewReceiptProbe(subj)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for i := range 3 {
		if d, err := probe.Measure(ctx, i); err != nil || d <= 0 {
			t.Fatalf("probe %d: %v, %v", i, d, err)
		}
	}
	// The probe's events are in SCALING; the consumer ceiling reads them back.
	if r, cpu, err := env.ConsumeCeiling(ctx, topology.StreamScaling, 3); err != nil || r <= 0 || cpu < 0 {
		t.Fatalf("consume ceiling %v (cpu %v), %v", r, cpu, err)
	}
	m, err := env.StartCPU(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := m.Stop(ctx, 10)
	if err != nil || cpu.Items != 10 || cpu.WallSeconds <= 0 || cpu.RedisSeconds < 0 {
		t.Fatalf("cpu %+v, %v", cpu, err)
	}
}
