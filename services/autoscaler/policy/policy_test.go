package policy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
)

var t0 = time.Date(2026, 6, 10, 12, 0, 0, 0, time.UTC)

// clock is a fake clock the tests advance by hand.
type clock struct{ now time.Time }

func (c *clock) advance(d time.Duration) time.Time { c.now = c.now.Add(d); return c.now }

// pool returns a valid pool with a concurrency threshold (scale out above
// 40 per replica, in below 20, steps of 2), 1..20 replicas, no cooldowns.
func pool(mut ...func(*policy.Pool)) policy.Pool {
	p := policy.Pool{
		ID: "web", Tenant: "acme",
		Rental:      policy.RentalShape{GPUCount: 1, MilliGPU: 1000},
		MinReplicas: 1, MaxReplicas: 20, MaxStepOut: 4, MaxStepIn: 4,
		Thresholds: []policy.Threshold{{Name: "busy", Metric: policy.ConcurrentPerReplica, ScaleOutAbove: 40, ScaleInBelow: 20, Step: 2}},
		StaleAfter: policy.Duration(2 * time.Minute),
	}
	for _, m := range mut {
		m(&p)
	}
	return p
}

// step observes a sample with the given concurrency at now and decides.
func step(p policy.Pool, st policy.State, now time.Time, concurrent int64) (policy.Decision, policy.State) {
	st, _ = policy.Observe(st, policy.Sample{At: now, Concurrent: concurrent, RPS: float64(concurrent) * 10})
	return policy.Decide(p, st, now)
}

func TestThresholdScalesOutAboveTheBoundAndNamesTheRule(t *testing.T) {
	t.Parallel()
	d, st := step(pool(), policy.State{Replicas: 2}, t0, 100) // 50 per replica
	if d.From != 2 || d.To != 4 || d.Rule != "threshold:busy" || d.Metric != string(policy.ConcurrentPerReplica) {
		t.Fatalf("got %+v", d)
	}
	if d.Observed != 50 || d.Threshold != 40 || !strings.Contains(d.Reason, "above") {
		t.Fatalf("decision does not carry what it saw: %+v", d)
	}
	if st.Replicas != 4 || !st.LastScaleOut.Equal(t0) {
		t.Fatalf("state not updated: %+v", st)
	}
}

func TestHysteresisPreventsFlapping(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		levels []int64 // total concurrency, alternating around a bound
	}{
		{"load oscillating just around the scale-out bound changes replicas once", []int64{170, 150, 170, 150, 170, 150, 170, 150}},
		{"load oscillating inside the band never changes replicas", []int64{90, 130, 90, 130, 90, 130}},
		{"load oscillating around the scale-in bound scales in once and stays", []int64{70, 90, 70, 90, 70, 90}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := pool()
			st := policy.State{Replicas: 4}
			clk := &clock{now: t0}
			var changes []string
			for _, l := range c.levels {
				d, next := step(p, st, clk.advance(time.Minute), l)
				if d.Changed() {
					changes = append(changes, describe(d))
				}
				st = next
			}
			if len(changes) > 1 {
				t.Fatalf("%d changes, want at most 1 (flapping):\n%s", len(changes), strings.Join(changes, "\n"))
			}
		})
	}
}

func TestScaleInLandsInsideTheBandSoItDoesNotScaleOutAgain(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) { p.Thresholds[0].Step = 10; p.MaxStepIn = 10 })
	d, st := step(p, policy.State{Replicas: 10}, t0, 150) // 15 per replica, below 20
	if !d.Changed() || d.To != 5 {                        // ceil(150 / 30) = 5, not 10-10 = 0
		t.Fatalf("got %+v", d)
	}
	d, _ = step(p, st, t0.Add(time.Minute), 150)
	if d.Changed() {
		t.Fatalf("the same load scaled again: %+v", d)
	}
}

func TestCooldownHoldsAndThenLets(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) {
		p.ScaleOutCooldown = policy.Duration(3 * time.Minute)
		p.ScaleInCooldown = policy.Duration(10 * time.Minute)
	})
	clk := &clock{now: t0}
	d, st := step(p, policy.State{Replicas: 2}, clk.now, 200)
	if d.To != 4 {
		t.Fatalf("first scale-out: %+v", d)
	}
	d, st = step(p, st, clk.advance(time.Minute), 400) // 100 per replica, still high
	if d.Changed() || d.Rule != policy.RuleCooldown || !strings.Contains(d.Reason, "scale-out cooldown") {
		t.Fatalf("cooldown did not hold: %+v", d)
	}
	d, st = step(p, st, clk.advance(2*time.Minute), 400)
	if d.To != 6 {
		t.Fatalf("after the cooldown: %+v", d)
	}
	d, st = step(p, st, clk.advance(time.Minute), 10) // load gone
	if d.Changed() || d.Rule != policy.RuleCooldown || !strings.Contains(d.Reason, "scale-in cooldown") {
		t.Fatalf("scale-in right after a scale-out: %+v", d)
	}
	d, _ = step(p, st, clk.advance(10*time.Minute), 10)
	if d.To >= 6 {
		t.Fatalf("no scale-in after the cooldown: %+v", d)
	}
}

func TestStepsAreBounded(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) {
		p.Thresholds = nil
		p.TargetTracking = &policy.Target{Metric: policy.ConcurrentPerReplica, Value: 10, Tolerance: 0.1}
		p.MaxStepOut, p.MaxStepIn = 3, 2
	})
	d, st := step(p, policy.State{Replicas: 2}, t0, 1000)
	if d.To != 5 || !strings.Contains(d.Reason, "step bounded to 3") {
		t.Fatalf("scale-out not bounded: %+v", d)
	}
	d, _ = step(p, st, t0.Add(time.Minute), 1)
	if d.To != 3 {
		t.Fatalf("scale-in not bounded: %+v", d)
	}
}

func TestTargetTrackingFollowsTheFormula(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) {
		p.Thresholds = nil
		p.TargetTracking = &policy.Target{Metric: policy.RPSPerReplica, Value: 100, Tolerance: 0.1}
		p.MaxStepOut, p.MaxStepIn = 20, 20
	})
	cases := []struct {
		name      string
		replicas  int
		rps       float64
		wantTo    int
		wantRule  string
		wantDelta bool
	}{
		{"load above target grows to ceil(current × observed / target)", 4, 650, 7, policy.RuleTargetTracking, true},
		{"load below target shrinks to ceil(current × observed / target)", 10, 420, 5, policy.RuleTargetTracking, true},
		{"load within the tolerance changes nothing", 5, 530, 5, "within-band:" + policy.RuleTargetTracking, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, _ := policy.Observe(policy.State{Replicas: c.replicas}, policy.Sample{At: t0, RPS: c.rps, Concurrent: 1})
			d, _ := policy.Decide(p, st, t0)
			if d.To != c.wantTo || d.Rule != c.wantRule || d.Changed() != c.wantDelta {
				t.Fatalf("got %+v", d)
			}
		})
	}
}

func TestP99ThresholdScalesOutOnLatency(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) {
		p.Thresholds = append(p.Thresholds, policy.Threshold{Name: "slow", Metric: policy.P99LatencyMS, ScaleOutAbove: 80, ScaleInBelow: 0, Step: 3})
	})
	st, _ := policy.Observe(policy.State{Replicas: 4}, policy.Sample{At: t0, Concurrent: 100, P99: 120 * time.Millisecond, HasP99: true})
	d, _ := policy.Decide(p, st, t0)
	if d.To != 7 || d.Rule != "threshold:slow" || d.Metric != "p99_latency_ms" || d.Observed != 120 {
		t.Fatalf("got %+v", d)
	}
	// The latency rule never scales in: below its bound it abstains, so
	// it neither scales in by itself nor vetoes the other rule's scale-in.
	only := pool(func(p *policy.Pool) {
		p.Thresholds = []policy.Threshold{{Name: "slow", Metric: policy.P99LatencyMS, ScaleOutAbove: 80, Step: 3}}
	})
	st, _ = policy.Observe(policy.State{Replicas: 4}, policy.Sample{At: t0, Concurrent: 10, P99: 5 * time.Millisecond, HasP99: true})
	if d, _ := policy.Decide(only, st, t0); d.Changed() {
		t.Fatalf("the latency rule alone scaled in: %+v", d)
	}
	if d, _ := policy.Decide(p, st, t0); d.To != 2 || d.Rule != "threshold:busy" {
		t.Fatalf("the latency rule vetoed the busy rule's scale-in: %+v", d)
	}
}

func TestPreWarmWindowAppliesAndEnds(t *testing.T) {
	t.Parallel()
	sale := t0.Add(72 * time.Hour)
	p := pool(func(p *policy.Pool) {
		p.MaxReplicas = 50
		p.PreWarm = []policy.PreWarm{{Name: "618", Start: t0, End: sale.Add(6 * time.Hour), PeakReplicas: 40, MinFractionOfPeak: 0.2}}
		p.ScaleInCooldown = policy.Duration(5 * time.Minute)
	})
	// Before the window: light traffic keeps 1 replica.
	d, st := step(p, policy.State{Replicas: 1}, t0.Add(-time.Hour), 5)
	if d.Changed() {
		t.Fatalf("before the window: %+v", d)
	}
	// The window opens: the floor is 20 % of 40 = 8 at once, whatever the traffic.
	d, st = policy.Decide(p, st, t0) // a tick, no new sample needed
	if d.To != 8 || d.Rule != "prewarm:618" || d.Metric != policy.MetricSchedule {
		t.Fatalf("window start: %+v", d)
	}
	// Inside the window light traffic cannot scale below the floor.
	d, st = step(p, st, t0.Add(24*time.Hour), 5)
	if d.To != 8 || d.Changed() {
		t.Fatalf("inside the window: %+v", d)
	}
	// Traffic above the floor still scales out.
	d, st = step(p, st, sale.Add(time.Hour), 8*60)
	if d.To <= 8 || d.Rule != "threshold:busy" {
		t.Fatalf("peak inside the window: %+v", d)
	}
	// After the window, light traffic scales the pool back in.
	end := sale.Add(6 * time.Hour)
	d, st = step(p, st, end.Add(time.Minute), 5)
	if d.To >= d.From || d.Rule != "threshold:busy" {
		t.Fatalf("after the window: %+v", d)
	}
	_ = st
}

func TestScaleToZeroAfterIdleAndWakeUp(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) {
		p.MinReplicas = 0
		p.ScaleToZero = &policy.ScaleToZero{IdleAfter: policy.Duration(15 * time.Minute)}
		p.ScaleInCooldown = policy.Duration(time.Hour) // scale-to-zero is not a metric rule
	})
	clk := &clock{now: t0}
	d, st := step(p, policy.State{Replicas: 3}, clk.now, 90)
	if d.Changed() {
		t.Fatalf("busy pool changed: %+v", d)
	}
	d, st = step(p, st, clk.advance(time.Minute), 0)
	if d.To == 0 {
		t.Fatalf("dropped to zero before idle_after: %+v", d)
	}
	for range 13 {
		d, st = step(p, st, clk.advance(time.Minute), 0)
		if d.To == 0 {
			t.Fatalf("dropped to zero after %s idle: %+v", clk.now.Sub(t0.Add(0)), d)
		}
	}
	d, st = step(p, st, clk.advance(time.Minute), 0) // 15 minutes without traffic
	if d.To != 0 || d.Rule != policy.RuleScaleToZero || d.Metric != policy.MetricIdleFor || d.Observed != 900 {
		t.Fatalf("no scale-to-zero: %+v", d)
	}
	// Ticks without samples keep it at zero.
	d, st = policy.Decide(p, st, clk.advance(time.Hour))
	if d.Changed() {
		t.Fatalf("tick while idle: %+v", d)
	}
	// Any traffic wakes it up, cooldown or not, sized by the metric rules.
	d, st = step(p, st, clk.advance(time.Second), 130)
	if d.From != 0 || d.Rule != policy.RuleWakeUp || d.To != 2 {
		t.Fatalf("wake-up: %+v", d)
	}
	if st.Replicas != 2 {
		t.Fatalf("state after wake-up: %+v", st)
	}
}

func TestMinAndMaxBoundEveryDecision(t *testing.T) {
	t.Parallel()
	p := pool(func(p *policy.Pool) { p.MinReplicas, p.MaxReplicas = 2, 5 })
	d, _ := step(p, policy.State{Replicas: 5}, t0, 10_000)
	if d.Changed() || d.Rule != policy.RuleMaxReplicas {
		t.Fatalf("at max: %+v", d)
	}
	d, _ = step(p, policy.State{Replicas: 4}, t0, 10_000)
	if d.To != 5 || !strings.Contains(d.Reason, "capped at max_replicas") {
		t.Fatalf("capped: %+v", d)
	}
	d, _ = step(p, policy.State{Replicas: 0}, t0, 0)
	if d.To != 2 || d.Rule != policy.RuleMinReplicas {
		t.Fatalf("below min: %+v", d)
	}
}

func TestStaleSamplesAreIgnored(t *testing.T) {
	t.Parallel()
	st, ok := policy.Observe(policy.State{}, policy.Sample{At: t0, Concurrent: 5})
	if !ok {
		t.Fatal("first sample refused")
	}
	if _, ok := policy.Observe(st, policy.Sample{At: t0.Add(-time.Second), Concurrent: 500}); ok {
		t.Fatal("an older sample replaced a newer one")
	}
	// Metric rules do not act on a sample older than stale_after.
	st.Replicas = 1
	st.Last.Concurrent = 500
	d, _ := policy.Decide(pool(), st, t0.Add(10*time.Minute))
	if d.Changed() || d.Rule != policy.RuleStaleSample {
		t.Fatalf("acted on a stale sample: %+v", d)
	}
}

func TestMarketMixChoosesByTimeOfDayAndFallsBackWhenSpotIsShort(t *testing.T) {
	t.Parallel()
	mix := &policy.MarketMix{Timezone: "Asia/Shanghai", SpotFrom: "22:00", SpotTo: "08:00", FallbackHold: policy.Duration(30 * time.Minute)}
	sh, _ := time.LoadLocation("Asia/Shanghai")
	night := time.Date(2026, 6, 17, 23, 30, 0, 0, sh)
	early := time.Date(2026, 6, 18, 7, 59, 0, 0, sh)
	day := time.Date(2026, 6, 18, 8, 0, 0, 0, sh)
	cases := []struct {
		name      string
		now       time.Time
		shortTill time.Time
		want      policy.Market
		rule      string
	}{
		{"late evening buys spot", night, time.Time{}, policy.Spot, policy.RuleMarketSpotTime},
		{"just before eight buys spot (window wraps midnight)", early, time.Time{}, policy.Spot, policy.RuleMarketSpotTime},
		{"eight o'clock buys on-demand", day, time.Time{}, policy.OnDemand, policy.RuleMarketDayTime},
		{"a spot shortage falls back to on-demand at night", night, night.Add(time.Minute), policy.OnDemand, policy.RuleSpotFallback},
		{"the fallback ends after its hold", night.Add(time.Hour), night.Add(time.Minute), policy.Spot, policy.RuleMarketSpotTime},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m, rule := policy.ChooseMarket(mix, c.now, c.shortTill)
			if m != c.want || rule != c.rule {
				t.Fatalf("got %s (%s), want %s (%s)", m, rule, c.want, c.rule)
			}
		})
	}
	p := pool(func(p *policy.Pool) { p.MarketMix = mix })
	st := policy.MarkSpotShort(p, policy.State{Replicas: 1}, night)
	st, _ = policy.Observe(st, policy.Sample{At: night, Concurrent: 500})
	d, _ := policy.Decide(p, st, night)
	if d.Market != policy.OnDemand || d.MarketRule != policy.RuleSpotFallback || d.Market.Plan().String() != "PLAN_ON_DEMAND" {
		t.Fatalf("decision market: %+v", d)
	}
	d, _ = policy.Decide(p, st, night.Add(31*time.Minute))
	if d.Market != policy.Spot || d.Market.Plan().String() != "PLAN_SPOT" {
		t.Fatalf("after the hold: %+v", d)
	}
}

// Property: whatever the samples and clock, replicas stay within
// [0, max], never below min while traffic flows, a metric-driven change
// never exceeds its step bound, and every decision names a rule and metric.
func TestDecisionsStayWithinBoundsProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		p := pool(func(p *policy.Pool) {
			p.MinReplicas = rapid.IntRange(0, 3).Draw(rt, "min")
			p.MaxReplicas = rapid.IntRange(max(p.MinReplicas, 1), 30).Draw(rt, "max")
			p.MaxStepOut = rapid.IntRange(1, 6).Draw(rt, "stepOut")
			p.MaxStepIn = rapid.IntRange(1, 6).Draw(rt, "stepIn")
			p.ScaleOutCooldown = policy.Duration(time.Duration(rapid.IntRange(0, 300).Draw(rt, "outCD")) * time.Second)
			p.ScaleToZero = &policy.ScaleToZero{IdleAfter: policy.Duration(10 * time.Minute)}
			p.TargetTracking = &policy.Target{Metric: policy.ConcurrentPerReplica, Value: 30, Tolerance: 0.1}
		})
		st := policy.State{Replicas: rapid.IntRange(0, p.MaxReplicas).Draw(rt, "start")}
		clk := &clock{now: t0}
		for i := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			now := clk.advance(time.Duration(rapid.IntRange(1, 600).Draw(rt, "dt")) * time.Second)
			var d policy.Decision
			if rapid.Bool().Draw(rt, "tick") {
				d, st = policy.Decide(p, st, now)
			} else {
				c := int64(rapid.IntRange(0, 2000).Draw(rt, "concurrent"))
				d, st = step(p, st, now, c)
			}
			if d.To < 0 || d.To > p.MaxReplicas {
				rt.Fatalf("step %d: %d replicas outside [0, %d]: %+v", i, d.To, p.MaxReplicas, d)
			}
			if d.Rule == "" || d.Metric == "" {
				rt.Fatalf("decision without rule or metric: %+v", d)
			}
			if strings.HasPrefix(d.Rule, "threshold:") || d.Rule == policy.RuleTargetTracking {
				if d.To-d.From > p.MaxStepOut || d.From-d.To > p.MaxStepIn {
					rt.Fatalf("metric step beyond bounds: %+v", d)
				}
			}
			if st.Replicas != d.To {
				rt.Fatalf("state %d != decision %d", st.Replicas, d.To)
			}
		}
	})
}

// describe is one line naming a decision's change, its rule and market.
func describe(d policy.Decision) string {
	return fmt.Sprintf("%s: %d -> %d by %s (%s %.2f vs %.2f): %s; new replicas on %s (%s)",
		d.Pool, d.From, d.To, d.Rule, d.Metric, d.Observed, d.Threshold, d.Reason, d.Market, d.MarketRule)
}
