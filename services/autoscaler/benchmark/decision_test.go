package benchmark_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/autoscaler/benchmark"
	"github.com/shizu-gpu/shizu/shared/benchkit/benchtest"
)

// BenchmarkDecisionLatency publishes b.N traffic samples that alternately
// scale a pool out and in (see Run) and reports sample -> ScalingDecided
// p50/p99 next to one bare JetStream publish -> receipt measured in the
// same run: the decision path has two such hops plus Redis.
//
//	go test -run '^$' -bench DecisionLatency -benchtime 1000x ./services/autoscaler/benchmark/
func BenchmarkDecisionLatency(b *testing.B) {
	env := benchtest.Env(b)
	b.ResetTimer()
	r, err := benchmark.Run(b.Context(), env, b.N)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.Extra["p50_ms"], "p50_ms")
	b.ReportMetric(r.Value, "p99_ms")
	b.ReportMetric(r.Extra["ceiling_p50_ms"], "ceiling_p50_ms")
	b.ReportMetric(r.Ceiling, "ceiling_p99_ms")
	b.ReportMetric(r.Ratio, "p99_vs_ceiling")
}

// TestRunDecidesEverySample checks the result's shape at a tiny size, not
// its timings: Run itself fails when a sample gets no decision.
func TestRunDecidesEverySample(t *testing.T) {
	r, err := benchmark.Run(t.Context(), benchtest.Env(t), 6)
	if err != nil {
		t.Fatal(err)
	}
	if r.Value <= 0 || r.Ceiling <= 0 || r.Ratio != r.Value/r.Ceiling || r.Goal != benchmark.GoalP99MS || !r.AtMost || r.Size != 6 {
		t.Fatalf("result %+v", r)
	}
	if r.Extra["p50_ms"] <= 0 || r.Extra["p50_ms"] > r.Value || r.Extra["ceiling_p50_ms"] <= 0 {
		t.Errorf("extra %v", r.Extra)
	}
}
