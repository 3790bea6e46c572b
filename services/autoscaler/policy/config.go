// Package policy decides how many replicas an autoscaled pool runs and on
// which market new replicas are bought. It is pure: every decision takes the
// pool's declared policy, its state, the latest traffic sample and `now`, and
// returns the decision (with the rule and metric that made it) and the new
// state. It imports neither NATS nor Redis, so the service, the burst
// simulation and the tests all run the same code.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
)

// Metric names a quantity a rule watches. The per-replica metrics divide a
// pool-wide sample by the replicas serving it.
type Metric string

// Metrics.
const (
	ConcurrentPerReplica Metric = "concurrent_requests_per_replica"
	RPSPerReplica        Metric = "requests_per_second_per_replica"
	P99LatencyMS         Metric = "p99_latency_ms"
)

func (m Metric) perReplica() bool { return m == ConcurrentPerReplica || m == RPSPerReplica }

func (m Metric) valid() bool { return m.perReplica() || m == P99LatencyMS }

// Duration is a time.Duration written as a Go duration string ("90s", "5m").
type Duration = fleet.Duration

// File is the autoscaler's policy file: the pools it scales and the fleet it
// provisions.
type File struct {
	Pools []Pool       `json:"pools"`
	Fleet fleet.Config `json:"fleet"`
}

// Pool is one autoscaled inference deployment: a set of identical rentals of
// one tenant.
type Pool struct {
	// ID names the pool; a subject token (traffic.<id>.sample).
	ID string `json:"id"`
	// Tenant owns and pays for the pool's rentals.
	Tenant string `json:"tenant"`
	// Rental is the shape of one replica.
	Rental RentalShape `json:"rental"`
	// MinReplicas is the floor while the pool has traffic; 0 needs
	// scale_to_zero.
	MinReplicas int `json:"min_replicas"`
	// MaxReplicas is the ceiling, always.
	MaxReplicas int `json:"max_replicas"`
	// MaxStepOut and MaxStepIn bound one metric-driven change.
	MaxStepOut int `json:"max_step_out"`
	MaxStepIn  int `json:"max_step_in"`
	// ScaleOutCooldown is the least time between two scale-outs;
	// ScaleInCooldown the least time between any change and a scale-in.
	ScaleOutCooldown Duration `json:"scale_out_cooldown"`
	ScaleInCooldown  Duration `json:"scale_in_cooldown"`
	// Thresholds are threshold rules with a hysteresis band.
	Thresholds []Threshold `json:"thresholds,omitempty"`
	// TargetTracking keeps a per-replica metric near a target.
	TargetTracking *Target `json:"target_tracking,omitempty"`
	// PreWarm windows keep a floor of replicas ahead of known peaks.
	PreWarm []PreWarm `json:"prewarm,omitempty"`
	// ScaleToZero lets an idle pool drop to zero replicas.
	ScaleToZero *ScaleToZero `json:"scale_to_zero,omitempty"`
	// MarketMix chooses spot or on-demand for new replicas by time of day;
	// absent means on-demand.
	MarketMix *MarketMix `json:"market_mix,omitempty"`
	// ProvisionAhead: when a scale-out needs more room than the fleet has
	// free, ask the provider for nodes at once instead of waiting for the
	// scheduler's capacity shortage.
	ProvisionAhead bool `json:"provision_ahead,omitempty"`
	// StaleAfter is how old the last sample may be for ticks to act on its
	// metrics (default 2m); older, only floors and scale-to-zero apply.
	StaleAfter Duration `json:"stale_after,omitempty"`
}

// RentalShape is what one replica rents.
type RentalShape struct {
	GPUCount int32    `json:"gpu_count"`
	MilliGPU int32    `json:"milli_gpu"`
	VRAMMiB  int64    `json:"vram_mib,omitempty"`
	Models   []string `json:"models,omitempty"`
	Zone     string   `json:"zone,omitempty"`
	Image    string   `json:"image,omitempty"`
}

// Spec is the rental spec of one replica bought on plan.
func (r RentalShape) Spec(plan shizuv1.Plan) *shizuv1.RentalSpec {
	return &shizuv1.RentalSpec{GpuCount: r.GPUCount, MilliGpu: r.MilliGPU, VramMib: r.VRAMMiB,
		AllowedModels: r.Models, Zone: r.Zone, Image: r.Image, Plan: plan}
}

// Threshold scales out by Step when Metric is above ScaleOutAbove and in by
// Step when it is below ScaleInBelow. The band between the two bounds is the
// hysteresis: a value inside it changes nothing.
type Threshold struct {
	Name          string  `json:"name"`
	Metric        Metric  `json:"metric"`
	ScaleOutAbove float64 `json:"scale_out_above"`
	// ScaleInBelow 0 means the rule never scales in.
	ScaleInBelow float64 `json:"scale_in_below,omitempty"`
	Step         int     `json:"step"`
}

// Target keeps a per-replica metric at Value: replicas =
// ceil(current × observed / Value), unless observed is within Tolerance
// (a fraction, default 0.1) of Value.
type Target struct {
	Metric    Metric  `json:"metric"`
	Value     float64 `json:"value"`
	Tolerance float64 `json:"tolerance,omitempty"`
}

// PreWarm keeps at least ceil(MinFractionOfPeak × PeakReplicas) replicas
// from Start (inclusive) to End (exclusive).
type PreWarm struct {
	Name              string    `json:"name"`
	Start             time.Time `json:"start"`
	End               time.Time `json:"end"`
	PeakReplicas      int       `json:"peak_replicas"`
	MinFractionOfPeak float64   `json:"min_fraction_of_peak"`
}

// Floor is the replicas the window keeps.
func (w PreWarm) Floor() int {
	return int(math.Ceil(w.MinFractionOfPeak*float64(w.PeakReplicas) - 1e-9))
}

// ScaleToZero drops the pool to zero after IdleAfter without traffic.
type ScaleToZero struct {
	IdleAfter Duration `json:"idle_after"`
}

// MarketMix buys new replicas on spot between SpotFrom and SpotTo (local
// "HH:MM" in Timezone; the window may wrap midnight) and on-demand
// otherwise, and falls back to on-demand for FallbackHold after spot
// capacity was reported short.
type MarketMix struct {
	Timezone     string   `json:"timezone"`
	SpotFrom     string   `json:"spot_from"`
	SpotTo       string   `json:"spot_to"`
	FallbackHold Duration `json:"fallback_hold"`
}

// Parse reads a policy file (JSON; unknown fields are errors), fills
// defaults and validates it, reporting every problem with its field path.
func Parse(data []byte) (File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return File{}, fmt.Errorf("policy file: %w", err)
	}
	for i := range f.Pools {
		f.Pools[i].applyDefaults()
	}
	if err := f.Validate(); err != nil {
		return File{}, err
	}
	return f, nil
}

// ParsePool reads one pool's policy in the policy file's pool format (JSON;
// unknown fields are errors), fills defaults and validates it with the
// file's rules, reporting every problem with its field path. Pools declared
// through the bus are read with it.
func ParsePool(data []byte) (Pool, error) {
	var p Pool
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Pool{}, fmt.Errorf("pool policy: %w", err)
	}
	if dec.More() {
		return Pool{}, errors.New("pool policy: more than one JSON value")
	}
	p.applyDefaults()
	if err := p.Validate(); err != nil {
		return Pool{}, err
	}
	return p, nil
}

func (p *Pool) applyDefaults() {
	if p.TargetTracking != nil && p.TargetTracking.Tolerance == 0 {
		p.TargetTracking.Tolerance = 0.1
	}
	if p.StaleAfter == 0 {
		p.StaleAfter = Duration(2 * time.Minute)
	}
}

// Validate reports every problem of the file, each with its field path.
func (f File) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range f.Pools {
		if err := p.Validate(); err != nil {
			errs = append(errs, prefix(fmt.Sprintf("pools[%d]", i), err))
		}
		if seen[p.ID] {
			errs = append(errs, fmt.Errorf("pools[%d].id: %q is declared twice", i, p.ID))
		}
		seen[p.ID] = true
	}
	if err := f.Fleet.Validate(); err != nil {
		errs = append(errs, prefix("fleet", err))
	}
	return errors.Join(errs...)
}

// Validate reports every problem of one pool.
func (p Pool) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if err := shizuv1.ValidToken(p.ID); err != nil {
		add("id", "%v", err)
	}
	if p.ID == "fleet" {
		add("id", `"fleet" names the shared fleet; choose another pool id`)
	}
	if err := shizuv1.ValidToken(p.Tenant); err != nil {
		add("tenant", "%v", err)
	}
	if err := p.Rental.Spec(shizuv1.Plan_PLAN_ON_DEMAND).Validate(); err != nil {
		errs = append(errs, prefix("rental", err))
	}
	if p.MinReplicas < 0 {
		add("min_replicas", "%d is negative", p.MinReplicas)
	}
	if p.MinReplicas == 0 && p.ScaleToZero == nil {
		add("min_replicas", "0 needs scale_to_zero (otherwise a pool at zero never sees traffic to wake it)")
	}
	if p.MaxReplicas < 1 {
		add("max_replicas", "%d; must be at least 1", p.MaxReplicas)
	}
	if p.MaxReplicas < p.MinReplicas {
		add("max_replicas", "%d is below min_replicas %d", p.MaxReplicas, p.MinReplicas)
	}
	if p.MaxStepOut < 1 {
		add("max_step_out", "%d; must be at least 1", p.MaxStepOut)
	}
	if p.MaxStepIn < 1 {
		add("max_step_in", "%d; must be at least 1", p.MaxStepIn)
	}
	if p.ScaleOutCooldown < 0 {
		add("scale_out_cooldown", "%s is negative", p.ScaleOutCooldown.D())
	}
	if p.ScaleInCooldown < 0 {
		add("scale_in_cooldown", "%s is negative", p.ScaleInCooldown.D())
	}
	if len(p.Thresholds) == 0 && p.TargetTracking == nil {
		add("thresholds", "missing: declare thresholds, target_tracking or both")
	}
	names := map[string]bool{}
	for i, t := range p.Thresholds {
		path := fmt.Sprintf("thresholds[%d]", i)
		if err := shizuv1.ValidToken(t.Name); err != nil {
			add(path+".name", "%v", err)
		} else if names[t.Name] {
			add(path+".name", "%q is used twice", t.Name)
		}
		names[t.Name] = true
		if !t.Metric.valid() {
			add(path+".metric", "%q is not one of %s, %s, %s", t.Metric, ConcurrentPerReplica, RPSPerReplica, P99LatencyMS)
		}
		if !(t.ScaleOutAbove > 0) || math.IsInf(t.ScaleOutAbove, 0) {
			add(path+".scale_out_above", "%v; must be a positive number", t.ScaleOutAbove)
		}
		if t.ScaleInBelow < 0 || t.ScaleInBelow >= t.ScaleOutAbove {
			add(path+".scale_in_below", "%v must be in [0, scale_out_above %v): the gap is the hysteresis band", t.ScaleInBelow, t.ScaleOutAbove)
		}
		if t.Step < 1 {
			add(path+".step", "%d; must be at least 1", t.Step)
		}
	}
	if tt := p.TargetTracking; tt != nil {
		if !tt.Metric.perReplica() {
			add("target_tracking.metric", "%q; target tracking needs a per-replica metric (%s or %s)", tt.Metric, ConcurrentPerReplica, RPSPerReplica)
		}
		if !(tt.Value > 0) || math.IsInf(tt.Value, 0) {
			add("target_tracking.value", "%v; must be a positive number", tt.Value)
		}
		if tt.Tolerance < 0 || tt.Tolerance >= 1 {
			add("target_tracking.tolerance", "%v must be in [0, 1)", tt.Tolerance)
		}
	}
	for i, w := range p.PreWarm {
		path := fmt.Sprintf("prewarm[%d]", i)
		if err := shizuv1.ValidToken(w.Name); err != nil {
			add(path+".name", "%v", err)
		}
		if w.Start.IsZero() || w.End.IsZero() || !w.End.After(w.Start) {
			add(path+".end", "%s must be after start %s (RFC 3339 times)", w.End.Format(time.RFC3339), w.Start.Format(time.RFC3339))
		}
		if w.PeakReplicas < 1 {
			add(path+".peak_replicas", "%d; must be at least 1", w.PeakReplicas)
		}
		if !(w.MinFractionOfPeak > 0 && w.MinFractionOfPeak <= 1) {
			add(path+".min_fraction_of_peak", "%v must be in (0, 1]", w.MinFractionOfPeak)
		}
		if w.Floor() > p.MaxReplicas && p.MaxReplicas >= 1 {
			add(path, "keeps %d replicas, above max_replicas %d", w.Floor(), p.MaxReplicas)
		}
	}
	if z := p.ScaleToZero; z != nil && z.IdleAfter <= 0 {
		add("scale_to_zero.idle_after", "%s; must be positive", z.IdleAfter.D())
	}
	if m := p.MarketMix; m != nil {
		if _, err := time.LoadLocation(m.Timezone); err != nil || m.Timezone == "" {
			add("market_mix.timezone", "%q is not an IANA time zone (e.g. \"Asia/Shanghai\", \"UTC\")", m.Timezone)
		}
		from, errFrom := parseClock(m.SpotFrom)
		if errFrom != nil {
			add("market_mix.spot_from", "%v", errFrom)
		}
		to, errTo := parseClock(m.SpotTo)
		if errTo != nil {
			add("market_mix.spot_to", "%v", errTo)
		}
		if errFrom == nil && errTo == nil && from == to {
			add("market_mix.spot_to", "%q equals spot_from; the spot window would be empty", m.SpotTo)
		}
		if m.FallbackHold <= 0 {
			add("market_mix.fallback_hold", "%s; must be positive", m.FallbackHold.D())
		}
	}
	if p.StaleAfter < 0 {
		add("stale_after", "%s is negative", p.StaleAfter.D())
	}
	return errors.Join(errs...)
}

// parseClock reads "HH:MM" as minutes after midnight.
func parseClock(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day \"HH:MM\"", s)
	}
	return t.Hour()*60 + t.Minute(), nil
}

// prefix puts path in front of every line of err (errors.Join keeps one
// problem per line).
func prefix(path string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	errs := make([]error, 0, len(lines))
	for _, l := range lines {
		if strings.HasPrefix(l, "[") {
			errs = append(errs, fmt.Errorf("%s%s", path, l))
		} else {
			errs = append(errs, fmt.Errorf("%s.%s", path, l))
		}
	}
	return errors.Join(errs...)
}
