package benchmark_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/metering/benchmark"
	"github.com/shizu-gpu/shizu/shared/benchkit/benchtest"
)

// BenchmarkIngest meters b.N short rentals (3 events each) with one
// replica on fresh real servers (see Run) and reports rental events/s end
// to end next to a bare JetStream consumer of the same events (ratio), and,
// steadier on a shared machine, the CPU an event costs the whole pipeline
// (this process with the embedded NATS server, plus redis-server) next to
// the bare consumer's (cpu-ratio), and the rate that cost allows on 2
// dedicated cores.
//
//	go test -run '^$' -bench Ingest -benchtime 20000x ./services/metering/benchmark/
func BenchmarkIngest(b *testing.B) {
	env := benchtest.Env(b)
	b.ResetTimer()
	r, err := benchmark.Run(b.Context(), env, b.N)
	if err != nil {
		b.Fatal(err)
	}
	cpu := r.CPU
	perEvent := cpu.PerItem()
	rawPerEvent := cpu.CeilingSeconds / float64(cpu.Items)
	b.ReportMetric(cpu.RedisSeconds/cpu.WallSeconds, "redis-cpu")
	b.ReportMetric(perEvent*1e6, "cpu-µs/event")
	b.ReportMetric(rawPerEvent*1e6, "raw-cpu-µs/event")
	b.ReportMetric(2/perEvent, "events/s-per-2-cores")
	b.ReportMetric(rawPerEvent/perEvent, "cpu-ratio")
	b.ReportMetric(r.Value, "events/s")
	b.ReportMetric(r.Extra["records_per_s"], "records/s")
	b.ReportMetric(r.Ceiling, "raw-events/s")
	b.ReportMetric(r.Ratio, "ratio")
}

// TestRunMetersEveryRentalOnce checks the result's shape at a tiny size,
// not its timings: Run itself fails unless every rental's usage records
// are published exactly once.
func TestRunMetersEveryRentalOnce(t *testing.T) {
	r, err := benchmark.Run(t.Context(), benchtest.Env(t), 20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Value <= 0 || r.Ceiling <= 0 || r.Ratio != r.Value/r.Ceiling || r.Goal != benchmark.Goal || r.Size != 20 {
		t.Fatalf("result %+v", r)
	}
	if got := r.Extra["usage_records"]; got < 20 || got > 40 {
		t.Errorf("%v usage records for 20 rentals, want 20..40 (two for one across a minute)", got)
	}
	if r.Extra["records_per_s"] <= 0 {
		t.Errorf("extra records_per_s = %v, want a positive rate", r.Extra["records_per_s"])
	}
	if r.CPU.Items != 60 || r.CPU.ProcessSeconds <= 0 || r.CPU.CeilingSeconds <= 0 {
		t.Errorf("cpu %+v", r.CPU)
	}
}
