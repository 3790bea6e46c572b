package placerate_test

import (
	"fmt"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/benchmark/placerate"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/benchkit"
)

// BenchmarkPlace makes b.N placement decisions per policy, scoring every
// node and 64 candidates, on 1,000 nodes x 8 GPUs kept ~60 % full, next to
// a bare scan of the same candidates in the same run.
//
//	go test -run '^$' -bench Place -benchtime=2000x ./services/scheduler/benchmark/placerate/
func BenchmarkPlace(b *testing.B) {
	for _, limit := range []int{0, 64} {
		for _, pol := range placement.Policies {
			name := fmt.Sprintf("candidates=%d/policy=%s", limit, pol)
			if limit == 0 {
				name = fmt.Sprintf("candidates=all/policy=%s", pol)
			}
			b.Run(name, func(b *testing.B) {
				r, err := placerate.RunWith(b.Context(), &benchkit.Env{}, b.N, placerate.Options{Policy: pol, MaxCandidates: limit})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(r.Value, "decisions/s")
				b.ReportMetric(r.Ceiling, "scan/s")
				b.ReportMetric(r.Ratio, "ratio_vs_scan")
			})
		}
	}
}

func TestRunMeasuresTheDefaultPolicyAgainstTheScan(t *testing.T) {
	r, err := placerate.Run(t.Context(), &benchkit.Env{}, 200)
	if err != nil {
		t.Fatal(err)
	}
	if r.Value <= 0 || r.Ceiling <= 0 || r.Ratio != r.Value/r.Ceiling || r.Goal != placerate.Goal || r.Size != 200 || r.Unit != "decisions/s" {
		t.Fatalf("result %+v", r)
	}
	if r.Pass != (r.Value >= r.Goal) {
		t.Fatalf("pass %v for %v against %v", r.Pass, r.Value, r.Goal)
	}
}
