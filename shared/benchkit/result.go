// Package benchkit is what Shizu's service benchmarks share, so that
// `go test -bench` and `shizu bench` run the same code: the servers a
// benchmark runs on (Env), the ceilings measured on them in the same run
// (bare capacity-store reserves, JetStream publishes, a bare JetStream
// consumer, one publish to its receipt), the CPU a phase cost, and the
// Result every benchmark returns. Each service's benchmark package has one
// Run(ctx, env, n) built from these.
package benchkit

import (
	"slices"
	"time"
)

// Result is one benchmark's measurement next to the ceiling measured in
// the same run on the same servers, and the design's goal. Its JSON is
// what `shizu bench -o json` prints for a check.
type Result struct {
	Measured string  `json:"measured"` // what Value is
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Ceiling is the most the machine gives the same path in this run
	// (e.g. bare Redis reserves, bare JetStream consumes); Ratio is
	// Value / Ceiling.
	Ceiling     float64 `json:"ceiling"`
	CeilingWhat string  `json:"ceiling_measured"`
	Ratio       float64 `json:"ratio"`
	// Goal is the target from the design; AtMost says lower is better.
	Goal   float64 `json:"goal"`
	AtMost bool    `json:"goal_is_upper_bound,omitempty"`
	Pass   bool    `json:"pass"`
	// Size is the amount of work (requests, events, samples, decisions).
	Size    int     `json:"size"`
	Seconds float64 `json:"seconds"`
	// Extra are further figures by name; the names are snake_case
	// ("paced_p99_ms", "records_per_s"): they are JSON keys of
	// `shizu bench -o json`.
	Extra map[string]float64 `json:"extra,omitempty"`
	// CPU is what the measured phase cost the processor, where a
	// benchmark measures it (go test -bench reports it).
	CPU CPU `json:"-"`
}

// Finish sets Ratio and Pass from Value, Ceiling and Goal.
func (r *Result) Finish() {
	r.Ratio = 0
	if r.Ceiling > 0 {
		r.Ratio = r.Value / r.Ceiling
	}
	if r.AtMost {
		r.Pass = r.Value < r.Goal
	} else {
		r.Pass = r.Value >= r.Goal
	}
}

// CPU is the processor time of a measured phase: this process (which holds
// the service under test and, in a benchmark, nats-server) and
// redis-server. On a shared machine the wall-clock rate follows other
// people's load; the CPU an item costs much less.
type CPU struct {
	Items          int     // requests or events the phase handled
	WallSeconds    float64 // the phase's wall-clock time
	ProcessSeconds float64 // this process, user + system
	RedisSeconds   float64 // redis-server (INFO cpu), user + system
	// CeilingSeconds is this process's CPU during the ceiling's run over
	// the same items, where measured (0 otherwise).
	CeilingSeconds float64
}

// Seconds is the whole phase's CPU: this process plus redis-server.
func (c CPU) Seconds() float64 { return c.ProcessSeconds + c.RedisSeconds }

// PerItem is the CPU seconds one item cost (0 without items).
func (c CPU) PerItem() float64 {
	if c.Items == 0 {
		return 0
	}
	return c.Seconds() / float64(c.Items)
}

// PercentileMS is the q-quantile (0..1) of the durations, in milliseconds
// (0 for none). It sorts a copy.
func PercentileMS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i].Microseconds()) / 1000
}
