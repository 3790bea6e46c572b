package replay

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

func loadDefault(b *testing.B) Trace {
	b.Helper()
	dir, err := FindTraceDir(".")
	if err != nil {
		b.Fatalf("this benchmark replays the full trace: %v", err)
	}
	tr, err := Load(filepath.Join(dir, DefaultNodeFile), filepath.Join(dir, DefaultPodFile))
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

var benchPolicies = []placement.Policy{placement.PolicyFGD, placement.PolicyShizu, placement.PolicyBestFit, placement.PolicyGPUPacking, placement.PolicyGPUClustering, placement.PolicyDotProduct, placement.PolicyRandom, placement.PolicyFirstFit}

// BenchmarkReplayAllPolicies replays the default trace in inflation mode
// under every policy × 10 seeds (42..51), in parallel, and reports the
// wall time of the whole plan and FGD's median unallocated GPU at 100 %.
//
//	go test -run '^$' -bench ReplayAllPolicies -benchtime 1x ./services/scheduler/replay/
func BenchmarkReplayAllPolicies(b *testing.B) {
	tr := loadDefault(b)
	for b.Loop() {
		sums, _, err := Execute(context.Background(), &tr, Plan{Policies: benchPolicies, Seeds: Seeds(42, 10)})
		if err != nil {
			b.Fatal(err)
		}
		if lv, ok := sums[0].Level(100); ok {
			b.ReportMetric(lv.Unalloc.Median, "fgd_unalloc_%")
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/plan")
}

// BenchmarkDecisions replays seed 42 under each policy on one goroutine and
// reports placement decisions per second (each decision scores all 1,213
// nodes, then updates the incremental fragmentation measure).
//
//	go test -run '^$' -bench Decisions -benchtime 1x ./services/scheduler/replay/
func BenchmarkDecisions(b *testing.B) {
	tr := loadDefault(b)
	for _, pol := range benchPolicies {
		b.Run(string(pol), func(b *testing.B) {
			tasks := 0
			for b.Loop() {
				r, err := Run(&tr, pol, 42, Options{})
				if err != nil {
					b.Fatal(err)
				}
				tasks += r.Tasks
			}
			b.ReportMetric(float64(tasks)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}
