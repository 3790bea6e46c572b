package benchmark_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/benchmark"
	"github.com/shizu-gpu/shizu/shared/benchkit/benchtest"
)

// BenchmarkEndToEnd pushes b.N rental requests through one scheduler
// replica per policy and candidate limit (see Run), on fresh real servers,
// and reports requests/s next to the ceilings measured in the same run:
// the capacity store's reserves/s (ratio_vs_redis) and JetStream
// publishes/s (ratio_vs_js/3: a placement costs three publishes), paced
// p50/p99 request -> scheduled, and the CPU the burst cost per request
// (this process, which holds the scheduler and nats-server, plus
// redis-server) with the cores 10,000 requests/s would take at that cost.
// Keep -benchtime at benchmark.MaxRequests (18,000x) or below: the fleet
// is full after that.
//
//	go test -run '^$' -bench EndToEnd -benchtime=10000x ./services/scheduler/benchmark/
func BenchmarkEndToEnd(b *testing.B) {
	for _, pol := range []string{"shizu", "fgd", "bestfit"} {
		for _, limit := range []int{64, 0} {
			name := fmt.Sprintf("policy=%s/candidates=%d", pol, limit)
			if limit == 0 {
				name = fmt.Sprintf("policy=%s/candidates=all", pol)
			}
			b.Run(name, func(b *testing.B) {
				env := benchtest.Env(b)
				b.ResetTimer()
				r, err := benchmark.RunWith(b.Context(), env, b.N, benchmark.Options{Policy: pol, MaxCandidates: limit})
				if err != nil {
					b.Fatal(err)
				}
				js := r.Extra["jetstream_publishes_per_s_div_3"] * 3
				b.ReportMetric(r.Value, "requests/s")
				b.ReportMetric(r.Ceiling, "redis_reserves/s")
				b.ReportMetric(js, "js_publishes/s")
				b.ReportMetric(r.Ratio, "ratio_vs_redis")
				b.ReportMetric(r.Extra["ratio_vs_jetstream_div_3"], "ratio_vs_js/3")
				b.ReportMetric(r.Extra["paced_p50_ms"], "p50_ms")
				b.ReportMetric(r.Extra["paced_p99_ms"], "p99_ms")
				b.ReportMetric(r.CPU.PerItem()*1e6, "cpu_us/request")
				b.ReportMetric(r.CPU.PerItem()*10000, "cores_for_10k/s")
			})
		}
	}
}

// TestRunPlacesEveryRequestAndMeasuresItsCeilings checks the result's
// shape at a tiny size, not its timings.
func TestRunPlacesEveryRequestAndMeasuresItsCeilings(t *testing.T) {
	r, err := benchmark.Run(t.Context(), benchtest.Env(t), 20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Value <= 0 || r.Ceiling <= 0 || r.Ratio != r.Value/r.Ceiling || r.Goal != benchmark.Goal || r.Size != 20 {
		t.Fatalf("result %+v", r)
	}
	for _, k := range []string{"jetstream_publishes_per_s_div_3", "ratio_vs_jetstream_div_3", "paced_p50_ms", "paced_p99_ms"} {
		if r.Extra[k] <= 0 {
			t.Errorf("extra %s = %v, want a positive figure", k, r.Extra[k])
		}
	}
	if r.CPU.Items != 20 || r.CPU.ProcessSeconds <= 0 || r.CPU.WallSeconds <= 0 {
		t.Errorf("cpu %+v", r.CPU)
	}
}

// A burst larger than the fleet holds is refused with the limit, before
// anything starts (it used to wait forever for requests that cannot fit).
func TestABurstLargerThanTheFleetIsRefused(t *testing.T) {
	t.Parallel()
	_, err := benchmark.Run(t.Context(), nil, benchmark.MaxRequests+1)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("ask for 1 to %d", benchmark.MaxRequests)) {
		t.Fatalf("Run(MaxRequests+1) = %v, want the limit named", err)
	}
}
