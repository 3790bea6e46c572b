package policy

import (
	"fmt"
	"math"
	"time"
)

// Rule names, as ScalingDecided.rule carries them. Threshold rules are
// "threshold:<name>", pre-warm floors "prewarm:<name>".
const (
	RuleTargetTracking = "target-tracking"
	RuleMinReplicas    = "min-replicas"
	RuleMaxReplicas    = "max-replicas"
	RuleScaleToZero    = "scale-to-zero"
	RuleWakeUp         = "wake-up"
	RuleCooldown       = "cooldown"
	RuleWithinBand     = "within-band"
	RuleNoSample       = "no-sample"
	RuleStaleSample    = "stale-sample"
	RuleNoNewSample    = "no-new-sample"
	// MetricIdleFor is the metric of scale-to-zero: seconds without traffic.
	MetricIdleFor = "idle_seconds"
	// MetricSchedule is the metric of schedule-driven floors.
	MetricSchedule = "schedule"
	// MetricReplicas is the metric of min/max clamps.
	MetricReplicas = "replicas"
)

// Sample is one traffic sample of a pool, in plain values.
type Sample struct {
	At         time.Time
	Concurrent int64
	RPS        float64
	// P99 is the window's p99 latency; HasP99 is false when no request
	// completed in the window.
	P99    time.Duration
	HasP99 bool
}

// Active reports whether the sample saw any traffic.
func (s Sample) Active() bool { return s.Concurrent > 0 || s.RPS > 0 }

// State is what the policy remembers about a pool between decisions.
type State struct {
	Replicas     int       `json:"replicas"`
	LastScaleOut time.Time `json:"last_scale_out"`
	LastScaleIn  time.Time `json:"last_scale_in"`
	// LastActive is the time of the last sample with traffic (or when the
	// pool was first seen).
	LastActive time.Time `json:"last_active"`
	// Last is the latest sample; zero At when none arrived yet.
	Last Sample `json:"last"`
	// EvaluatedAt is the time of the last sample metric rules acted on.
	EvaluatedAt time.Time `json:"evaluated_at"`
	// SpotShortUntil: new replicas go on-demand until then.
	SpotShortUntil time.Time `json:"spot_short_until"`
}

// Decision is the outcome of one evaluation; every decision names the rule
// and the metric that made it, even when nothing changes.
type Decision struct {
	Pool      string
	From, To  int
	Rule      string
	Metric    string
	Observed  float64
	Threshold float64
	Reason    string
	// Market is where new replicas are bought, MarketRule why.
	Market     Market
	MarketRule string
}

// Changed reports whether the decision changes the replica count.
func (d Decision) Changed() bool { return d.From != d.To }

type proposal struct {
	to                  int
	rule, metric        string
	observed, threshold float64
	reason              string
}

// value reads metric from s with cur replicas serving it.
func value(m Metric, s Sample, cur int) float64 {
	n := float64(max(cur, 1))
	switch m {
	case ConcurrentPerReplica:
		return float64(s.Concurrent) / n
	case RPSPerReplica:
		return s.RPS / n
	case P99LatencyMS:
		return float64(s.P99) / float64(time.Millisecond)
	}
	return 0
}

// total is the pool-wide amount behind a per-replica metric.
func total(m Metric, s Sample) float64 {
	if m == ConcurrentPerReplica {
		return float64(s.Concurrent)
	}
	return s.RPS
}

// Observe records a sample in the state without deciding; samples older
// than the latest are ignored (false).
func Observe(st State, s Sample) (State, bool) {
	if !st.Last.At.IsZero() && s.At.Before(st.Last.At) {
		return st, false
	}
	st.Last = s
	if s.Active() || st.LastActive.IsZero() {
		st.LastActive = s.At
	}
	return st, true
}

// Decide evaluates p for a pool in state st at now, using the latest
// sample in st (record new samples with Observe first). The order is:
// wake-up from zero; metric rules (threshold with hysteresis, target
// tracking), where any rule asking for more wins and a scale-in needs every
// rule to agree; cooldown; bounded steps; floors (min replicas, pre-warm
// windows) that apply at once; scale-to-zero after the idle period; the
// max ceiling.
func Decide(p Pool, st State, now time.Time) (Decision, State) {
	cur := st.Replicas
	d := Decision{Pool: p.ID, From: cur, To: cur}
	d.Market, d.MarketRule = ChooseMarket(p.MarketMix, now, st.SpotShortUntil)
	s := st.Last
	// Metric rules act once per sample: re-reading an old sample against
	// the replicas it already caused would scale twice for one load.
	unseen := !s.At.IsZero() && s.At.After(st.EvaluatedAt)
	fresh := unseen && now.Sub(s.At) <= max(p.StaleAfter.D(), 0)
	if unseen {
		st.EvaluatedAt = s.At
	}

	// Floors: min replicas while active, pre-warm windows always.
	floor, floorRule, floorReason := p.MinReplicas, RuleMinReplicas, fmt.Sprintf("min_replicas is %d", p.MinReplicas)
	if p.ScaleToZero != nil && floor < 1 {
		floor = 1
		floorReason = "an active pool keeps at least 1 replica"
	}
	for _, w := range p.PreWarm {
		if !now.Before(w.Start) && now.Before(w.End) && w.Floor() > floor {
			floor, floorRule = w.Floor(), "prewarm:"+w.Name
			floorReason = fmt.Sprintf("pre-warm window %s (%s to %s) keeps %.0f%% of peak %d = %d replicas",
				w.Name, w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339), w.MinFractionOfPeak*100, w.PeakReplicas, w.Floor())
		}
	}
	idle := now.Sub(st.LastActive)
	idleLong := p.ScaleToZero != nil && !st.LastActive.IsZero() && idle >= p.ScaleToZero.IdleAfter.D() &&
		!(fresh && s.Active())
	if idleLong && floorRule == RuleMinReplicas {
		floor = 0
	}

	var chosen proposal
	switch {
	case cur == 0 && fresh && s.Active():
		// Wake-up: any traffic brings the pool back, bypassing cooldowns.
		to := max(floor, 1)
		chosen = proposal{to: to, rule: RuleWakeUp, metric: string(ConcurrentPerReplica),
			observed: float64(s.Concurrent), threshold: 0,
			reason: fmt.Sprintf("traffic at zero replicas (%d concurrent, %.1f req/s)", s.Concurrent, s.RPS)}
		for _, pr := range metricProposals(p, s, 0) {
			if pr.to > chosen.to {
				chosen.to = pr.to
			}
		}
		chosen.to = min(chosen.to, p.MaxReplicas)
	case !fresh:
		rule, reason := RuleNoSample, "no traffic sample yet"
		switch {
		case s.At.IsZero():
		case !unseen:
			rule, reason = RuleNoNewSample, "no new sample since the last decision; metric rules wait for one"
		default:
			rule, reason = RuleStaleSample, fmt.Sprintf("last sample is %s old; metric rules wait for a fresh one", now.Sub(s.At).Round(time.Second))
		}
		chosen = proposal{to: cur, rule: rule, metric: string(ConcurrentPerReplica), reason: reason}
	default:
		chosen = combine(cur, metricProposals(p, s, cur))
		if chosen.to > cur {
			if since := now.Sub(st.LastScaleOut); !st.LastScaleOut.IsZero() && since < p.ScaleOutCooldown.D() {
				chosen = held(chosen, cur, fmt.Sprintf("scale-out cooldown: last scale-out %s ago, cooldown %s", since.Round(time.Second), p.ScaleOutCooldown.D()))
			} else if chosen.to-cur > p.MaxStepOut {
				chosen.reason += fmt.Sprintf("; step bounded to %d", p.MaxStepOut)
				chosen.to = cur + p.MaxStepOut
			}
		} else if chosen.to < cur {
			last := st.LastScaleOut
			if st.LastScaleIn.After(last) {
				last = st.LastScaleIn
			}
			if since := now.Sub(last); !last.IsZero() && since < p.ScaleInCooldown.D() {
				chosen = held(chosen, cur, fmt.Sprintf("scale-in cooldown: last change %s ago, cooldown %s", since.Round(time.Second), p.ScaleInCooldown.D()))
			} else if cur-chosen.to > p.MaxStepIn {
				chosen.reason += fmt.Sprintf("; step bounded to %d", p.MaxStepIn)
				chosen.to = cur - p.MaxStepIn
			}
		}
	}

	// Floors apply at once, whatever the cooldown.
	if chosen.to < floor {
		chosen = proposal{to: floor, rule: floorRule, metric: MetricSchedule, observed: float64(chosen.to),
			threshold: float64(floor), reason: floorReason}
		if floorRule == RuleMinReplicas {
			chosen.metric = MetricReplicas
		}
	}
	// Scale to zero once idle long enough (pre-warm floors keep replicas).
	if idleLong && floor == 0 && chosen.to > 0 && cur > 0 {
		chosen = proposal{to: 0, rule: RuleScaleToZero, metric: MetricIdleFor, observed: idle.Seconds(),
			threshold: p.ScaleToZero.IdleAfter.D().Seconds(),
			reason:    fmt.Sprintf("no traffic for %s (idle_after %s)", idle.Round(time.Second), p.ScaleToZero.IdleAfter.D())}
	}
	if chosen.to > p.MaxReplicas {
		was := chosen
		chosen.to = p.MaxReplicas
		chosen.reason = fmt.Sprintf("%s; capped at max_replicas %d", was.reason, p.MaxReplicas)
		if chosen.to <= cur {
			chosen = proposal{to: p.MaxReplicas, rule: RuleMaxReplicas, metric: MetricReplicas,
				observed: float64(was.to), threshold: float64(p.MaxReplicas),
				reason: fmt.Sprintf("%s wanted %d; max_replicas is %d", was.rule, was.to, p.MaxReplicas)}
		}
	}

	d.To, d.Rule, d.Metric, d.Observed, d.Threshold, d.Reason = chosen.to, chosen.rule, chosen.metric, chosen.observed, chosen.threshold, chosen.reason
	switch {
	case d.To > cur:
		st.LastScaleOut = now
	case d.To < cur:
		st.LastScaleIn = now
	}
	st.Replicas = d.To
	return d, st
}

func held(p proposal, cur int, why string) proposal {
	return proposal{to: cur, rule: RuleCooldown, metric: p.metric, observed: p.observed, threshold: p.threshold,
		reason: fmt.Sprintf("%s wanted %d replicas; %s", p.rule, p.to, why)}
}

// metricProposals asks every metric rule what it wants.
func metricProposals(p Pool, s Sample, cur int) []proposal {
	var out []proposal
	for _, t := range p.Thresholds {
		if t.Metric == P99LatencyMS && !s.HasP99 {
			continue
		}
		v := value(t.Metric, s, cur)
		pr := proposal{to: cur, rule: "threshold:" + t.Name, metric: string(t.Metric), observed: v}
		switch {
		case v > t.ScaleOutAbove:
			pr.to, pr.threshold = cur+t.Step, t.ScaleOutAbove
			pr.reason = fmt.Sprintf("%s %.2f above %.2f: +%d", t.Metric, v, t.ScaleOutAbove, t.Step)
		case t.ScaleInBelow > 0 && v < t.ScaleInBelow:
			pr.to, pr.threshold = max(cur-t.Step, 0), t.ScaleInBelow
			if t.Metric.perReplica() {
				// Land inside the band, so the smaller pool does not cross
				// the scale-out bound at once (no flapping).
				mid := (t.ScaleInBelow + t.ScaleOutAbove) / 2
				pr.to = max(pr.to, int(math.Ceil(total(t.Metric, s)/mid-1e-9)))
			}
			pr.reason = fmt.Sprintf("%s %.2f below %.2f: -%d", t.Metric, v, t.ScaleInBelow, cur-pr.to)
		case t.ScaleInBelow == 0:
			// A rule that never scales in abstains below its bound, so it
			// does not veto the other rules' scale-in.
			continue
		default:
			pr.threshold = t.ScaleOutAbove
			pr.reason = fmt.Sprintf("%s %.2f inside the band [%.2f, %.2f]", t.Metric, v, t.ScaleInBelow, t.ScaleOutAbove)
		}
		out = append(out, pr)
	}
	if tt := p.TargetTracking; tt != nil {
		v := value(tt.Metric, s, cur)
		pr := proposal{to: cur, rule: RuleTargetTracking, metric: string(tt.Metric), observed: v, threshold: tt.Value}
		if cur == 0 || math.Abs(v/tt.Value-1) > tt.Tolerance {
			pr.to = int(math.Ceil(total(tt.Metric, s)/tt.Value - 1e-9))
			pr.reason = fmt.Sprintf("%s %.2f vs target %.2f: ceil(%d × %.2f / %.2f) = %d", tt.Metric, v, tt.Value, cur, v, tt.Value, pr.to)
		} else {
			pr.reason = fmt.Sprintf("%s %.2f within %.0f%% of target %.2f", tt.Metric, v, tt.Tolerance*100, tt.Value)
		}
		out = append(out, pr)
	}
	return out
}

// combine: the largest scale-out wins; a scale-in happens only when every
// rule wants one, and then by the smallest amount any rule asks.
func combine(cur int, ps []proposal) proposal {
	if len(ps) == 0 {
		return proposal{to: cur, rule: RuleWithinBand, metric: string(ConcurrentPerReplica), reason: "no metric rule applies"}
	}
	best := ps[0]
	allIn := true
	for _, p := range ps {
		if p.to > best.to {
			best = p
		}
		if p.to >= cur {
			allIn = false
		}
	}
	if best.to > cur {
		return best
	}
	if allIn {
		return best // the largest of the scale-in targets: the mildest
	}
	for _, p := range ps {
		if p.to == cur {
			p.rule = RuleWithinBand + ":" + p.rule
			return p
		}
	}
	return proposal{to: cur, rule: RuleWithinBand, metric: best.metric, reason: "rules disagree"}
}
