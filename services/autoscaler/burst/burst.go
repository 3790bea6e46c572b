// Package burst is a reproducible simulation of a serving pool through a
// sale-day burst modelled on the founding text's 618 sale: a diurnal base
// load, a multi-hour ramp to a peak many times the base, and short spikes.
// The pool's replicas each serve a fixed rate; latency follows an M/M/c
// queue (Erlang C, see Queue) with a fluid backlog carrying any overload
// from one step to the next. The pool is scaled by the autoscaler's own
// policy package, fed the samples a gateway would publish, and compared
// with an always-on pool sized for the peak.
package burst

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
)

// Spike is a short burst on top of the curve: the load is multiplied by
// Multiplier for Duration from At (with a one-minute rise and fall).
type Spike struct {
	At         time.Time
	Duration   time.Duration
	Multiplier float64
}

// Scenario is the traffic and the pool.
type Scenario struct {
	Start    time.Time
	Duration time.Duration
	// Step is the simulation step; SampleEvery the gateway's sample window.
	Step        time.Duration
	SampleEvery time.Duration
	// BaseRPS is the daily peak of ordinary days; the daily trough is
	// BaseRPS/3 (a cosine over the day, peaking at 21:00 local).
	BaseRPS float64
	Zone    *time.Location
	// RampStart to PeakStart: the load rises smoothly to PeakMultiplier ×
	// BaseRPS; it holds until PeakEnd and decays back over Decay.
	RampStart, PeakStart, PeakEnd time.Time
	Decay                         time.Duration
	PeakMultiplier                float64
	Spikes                        []Spike
	// Noise is the relative standard deviation of per-step noise, seeded.
	Noise float64
	Seed  uint64

	// SlotsPerReplica requests run at once on a replica, each taking an
	// exponentially distributed service time of mean ServiceTime.
	SlotsPerReplica int
	ServiceTime     time.Duration
	// Startup is how long a new replica takes to serve (rental placed,
	// model loaded).
	Startup time.Duration
	// SLO is the p99 latency goal; the always-on pool is the smallest that
	// meets it at the scenario's highest load.
	SLO time.Duration
	// OnDemandMicros and SpotMicros are prices per GPU-hour.
	OnDemandMicros, SpotMicros int64
	Pool                       policy.Pool
}

// Sale618 is the default scenario: five ordinary-to-pre-warm days before
// the 618 sale (peak from 20:00 on June 18, Beijing time), a ramp from
// 12:00 to 20:00 up to 10× the base, spikes at the opening, at 21:00, 22:00
// and midnight, and the night after.
func Sale618() Scenario {
	sh := time.FixedZone("CST", 8*3600)
	day := func(d, h, m int) time.Time { return time.Date(2026, 6, d, h, m, 0, 0, sh) }
	peak := 56 // replicas the operator expects at the peak, for the pre-warm floor
	return Scenario{
		Start: day(14, 0, 0), Duration: 5*24*time.Hour + 6*time.Hour,
		Step: 5 * time.Second, SampleEvery: 15 * time.Second,
		BaseRPS: 2000, Zone: sh,
		RampStart: day(18, 12, 0), PeakStart: day(18, 20, 0), PeakEnd: day(19, 0, 30), Decay: 2 * time.Hour,
		PeakMultiplier: 10,
		Spikes: []Spike{
			{At: day(18, 20, 0), Duration: 5 * time.Minute, Multiplier: 1.6},
			{At: day(18, 21, 0), Duration: 3 * time.Minute, Multiplier: 1.3},
			{At: day(18, 22, 0), Duration: 3 * time.Minute, Multiplier: 1.3},
			{At: day(19, 0, 0), Duration: 5 * time.Minute, Multiplier: 1.5},
		},
		Noise: 0.03, Seed: 618,
		SlotsPerReplica: 8, ServiceTime: 10 * time.Millisecond, Startup: 2 * time.Minute,
		SLO:            80 * time.Millisecond,
		OnDemandMicros: 2_490_000, SpotMicros: 1_490_000,
		Pool: policy.Pool{
			ID: "chat", Tenant: "acme", Rental: policy.RentalShape{GPUCount: 1, MilliGPU: 1000},
			MinReplicas: 2, MaxReplicas: 96, MaxStepOut: 16, MaxStepIn: 2,
			ScaleOutCooldown: policy.Duration(30 * time.Second), ScaleInCooldown: policy.Duration(5 * time.Minute),
			Thresholds: []policy.Threshold{
				{Name: "slow", Metric: policy.P99LatencyMS, ScaleOutAbove: 60, Step: 4},
			},
			TargetTracking: &policy.Target{Metric: policy.RPSPerReplica, Value: 640, Tolerance: 0.1},
			// Pre-warm + elastic: 20 % of the expected peak from three days
			// before, and the whole expected peak around the opening and
			// midnight spikes, which come faster than replicas start.
			PreWarm: []policy.PreWarm{
				{Name: "618", Start: day(15, 20, 0), End: day(19, 2, 0), PeakReplicas: peak, MinFractionOfPeak: 0.2},
				{Name: "618-peak", Start: day(18, 19, 45), End: day(19, 0, 30), PeakReplicas: peak, MinFractionOfPeak: 1},
			},
			MarketMix:  &policy.MarketMix{Timezone: "Asia/Shanghai", SpotFrom: "01:00", SpotTo: "09:00", FallbackHold: policy.Duration(30 * time.Minute)},
			StaleAfter: policy.Duration(2 * time.Minute),
		},
	}
}

// SaleDay is Sale618 cut to the 30 hours from midnight before the sale to
// the morning after, so the comparison is not diluted by quiet days.
func SaleDay() Scenario {
	s := Sale618()
	s.Start = time.Date(2026, 6, 18, 0, 0, 0, 0, s.Zone)
	s.Duration = 30 * time.Hour
	return s
}

// WithoutPeakWindow drops the pre-warm windows that hold the whole
// expected peak, leaving the 20 % floor and the elastic rules alone: what
// happens when the operator does not know when the spikes come.
func (s Scenario) WithoutPeakWindow() Scenario {
	var keep []policy.PreWarm
	for _, w := range s.Pool.PreWarm {
		if w.MinFractionOfPeak < 1 {
			keep = append(keep, w)
		}
	}
	s.Pool.PreWarm = keep
	return s
}

// Load is the arrival rate at t without noise.
func (s Scenario) Load(t time.Time) float64 {
	h := float64(t.In(s.Zone).Hour()) + float64(t.In(s.Zone).Minute())/60
	diurnal := s.BaseRPS * (2 + math.Cos(2*math.Pi*(h-21)/24)) / 3
	mult := 1.0
	switch {
	case t.Before(s.RampStart):
	case t.Before(s.PeakStart):
		x := float64(t.Sub(s.RampStart)) / float64(s.PeakStart.Sub(s.RampStart))
		mult = 1 + (s.PeakMultiplier-1)*x*x*(3-2*x) // smoothstep
	case t.Before(s.PeakEnd):
		mult = s.PeakMultiplier
	case t.Before(s.PeakEnd.Add(s.Decay)):
		x := float64(t.Sub(s.PeakEnd)) / float64(s.Decay)
		mult = s.PeakMultiplier - (s.PeakMultiplier-1)*x*x*(3-2*x)
	}
	load := diurnal * mult
	if mult > 1 {
		// The sale's load is driven by the event, not by the time of day.
		load = s.BaseRPS * mult
	}
	for _, sp := range s.Spikes {
		if t.Before(sp.At) || !t.Before(sp.At.Add(sp.Duration)) {
			continue
		}
		rise := math.Min(1, math.Min(t.Sub(sp.At).Minutes(), sp.At.Add(sp.Duration).Sub(t).Minutes()))
		load *= 1 + (sp.Multiplier-1)*rise
	}
	return load
}

// Point is the pool's state at one step.
type Point struct {
	At time.Time
	// RPS offered; Serving replicas (started), Requested replicas (paid).
	RPS                 float64
	Serving, Requested  int
	P99                 time.Duration
	Utilization         float64
	Backlog             float64
	Decision            string
	SpotReplicas        int
	AlwaysOnP99         time.Duration
	AlwaysOnUtilization float64
}

// Result is a whole run.
type Result struct {
	Scenario Scenario
	Points   []Point
	// P99 is the 99th percentile over every request of the run; MaxP99
	// the worst step; StepsOverSLO the share of steps whose p99 exceeded
	// the SLO.
	P99, MaxP99  time.Duration
	StepsOverSLO float64
	// Same for the always-on pool of AlwaysOnReplicas.
	AlwaysOnReplicas int
	AlwaysOnP99      time.Duration
	// GPUHours paid by each pool, and money (micro-units) with the
	// autoscaled pool's market mix vs the always-on pool on-demand.
	GPUHours, AlwaysOnGPUHours float64
	// SpotGPUHours is the part of GPUHours bought on spot.
	SpotGPUHours               float64
	CostMicros, AlwaysOnMicros int64
	Decisions                  int
}

// GPUHourSaving is the autoscaled pool's GPU-hours below the always-on
// pool's, as a fraction.
func (r Result) GPUHourSaving() float64 { return 1 - r.GPUHours/r.AlwaysOnGPUHours }

// CostSaving is the same in money.
func (r Result) CostSaving() float64 {
	return 1 - float64(r.CostMicros)/float64(r.AlwaysOnMicros)
}

type replica struct {
	readyAt time.Time
	market  policy.Market
}

// Run simulates the scenario.
func Run(s Scenario) (Result, error) {
	if err := s.Pool.Validate(); err != nil {
		return Result{}, fmt.Errorf("burst: pool policy: %w", err)
	}
	mu := 1 / s.ServiceTime.Seconds()
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
	res := Result{Scenario: s}
	steps := int(s.Duration / s.Step)
	loads := make([]float64, steps)
	peak := 0.0
	for i := range steps {
		l := s.Load(s.Start.Add(time.Duration(i) * s.Step))
		l *= math.Max(0, 1+s.Noise*rng.NormFloat64())
		loads[i] = l
		peak = math.Max(peak, l)
	}
	res.AlwaysOnReplicas = sizeFor(peak, mu, s.SlotsPerReplica, s.SLO)

	var (
		st              = policy.State{}
		reps            []replica
		backlog         float64 // requests waiting beyond the M/M/c steady state
		aoBacklog       float64
		queues          = make([]Queue, 0, steps)
		weights         = make([]float64, 0, steps)
		aoQueues        = make([]Queue, 0, steps)
		windowP99       time.Duration
		windowN         int
		windowRPS       float64
		windowConc      float64
		over            int
		reqSec, spotSec float64
	)
	// Start as a pool that has been running: sized for the first load.
	initial := s.Pool.MinReplicas
	if tt := s.Pool.TargetTracking; tt != nil && tt.Metric == policy.RPSPerReplica {
		initial = max(initial, int(math.Ceil(loads[0]/tt.Value)))
	}
	st.Replicas = initial
	market, _ := policy.ChooseMarket(s.Pool.MarketMix, s.Start, time.Time{})
	for range initial {
		reps = append(reps, replica{readyAt: s.Start, market: market})
	}
	dt := s.Step.Seconds()
	for i := range steps {
		now := s.Start.Add(time.Duration(i) * s.Step)
		lambda := loads[i]
		serving := 0
		spot := 0
		for _, r := range reps {
			if !now.Before(r.readyAt) {
				serving++
			}
			if r.market == policy.Spot {
				spot++
			}
		}
		q, b := stepQueue(lambda, mu, serving*s.SlotsPerReplica, backlog, dt)
		backlog = b
		aq, ab := stepQueue(lambda, mu, res.AlwaysOnReplicas*s.SlotsPerReplica, aoBacklog, dt)
		aoBacklog = ab
		queues = append(queues, q)
		aoQueues = append(aoQueues, aq)
		weights = append(weights, lambda*dt)
		p99 := seconds(q.Quantile(0.99))
		if p99 > s.SLO {
			over++
		}
		res.MaxP99 = max(res.MaxP99, p99)
		reqSec += float64(len(reps)) * dt
		spotSec += float64(spot) * dt

		// The gateway's sample: rate, in-flight requests (Little's law plus
		// the backlog) and the window's worst p99.
		windowP99 = max(windowP99, p99)
		windowRPS += lambda
		windowConc += lambda*q.Mean() + backlog
		windowN++
		pt := Point{At: now, RPS: lambda, Serving: serving, Requested: len(reps), P99: p99, Backlog: backlog,
			Utilization: utilization(lambda, mu, serving*s.SlotsPerReplica), SpotReplicas: spot,
			AlwaysOnP99:         seconds(aq.Quantile(0.99)),
			AlwaysOnUtilization: utilization(lambda, mu, res.AlwaysOnReplicas*s.SlotsPerReplica)}
		if time.Duration(windowN)*s.Step >= s.SampleEvery {
			sample := policy.Sample{At: now, RPS: windowRPS / float64(windowN),
				Concurrent: int64(math.Round(windowConc / float64(windowN))), P99: windowP99, HasP99: true}
			st, _ = policy.Observe(st, sample)
			windowP99, windowN, windowRPS, windowConc = 0, 0, 0, 0
			var dec policy.Decision
			dec, st = policy.Decide(s.Pool, st, now)
			if dec.Changed() {
				res.Decisions++
				pt.Decision = dec.Rule
				for len(reps) < dec.To {
					reps = append(reps, replica{readyAt: now.Add(s.Startup), market: dec.Market})
				}
				if len(reps) > dec.To {
					reps = reps[:dec.To] // newest first, as the service cancels them
				}
			}
		}
		res.Points = append(res.Points, pt)
	}
	res.StepsOverSLO = float64(over) / float64(steps)
	res.P99 = seconds(mixtureQuantile(queues, weights, 0.99))
	res.AlwaysOnP99 = seconds(mixtureQuantile(aoQueues, weights, 0.99))
	res.GPUHours = reqSec / 3600 * float64(s.Pool.Rental.GPUCount)
	res.AlwaysOnGPUHours = float64(res.AlwaysOnReplicas) * s.Duration.Hours() * float64(s.Pool.Rental.GPUCount)
	res.SpotGPUHours = spotSec / 3600 * float64(s.Pool.Rental.GPUCount)
	res.CostMicros = int64(math.Round((reqSec-spotSec)/3600*float64(s.OnDemandMicros) + spotSec/3600*float64(s.SpotMicros)))
	res.AlwaysOnMicros = int64(math.Round(res.AlwaysOnGPUHours * float64(s.OnDemandMicros)))
	return res, nil
}

// stepQueue advances the backlog over one step and returns the queue the
// step's requests see. Up to 98% utilization the M/M/c steady state holds;
// arrivals beyond that join a fluid backlog that drains at the spare rate,
// and every request waits backlog/(service rate) on top.
func stepQueue(lambda, mu float64, slots int, backlog, dt float64) (Queue, float64) {
	capacity := float64(slots) * mu
	const maxRho = 0.98
	if slots == 0 {
		backlog += lambda * dt
		return Queue{Lambda: lambda, Mu: mu, Offset: 3600, theta: math.Inf(1)}, backlog
	}
	served := math.Min(lambda, maxRho*capacity)
	backlog += (lambda - served) * dt
	if lambda < maxRho*capacity {
		backlog = math.Max(0, backlog-(maxRho*capacity-lambda)*dt)
	}
	return NewQueue(served, mu, slots, backlog/capacity), backlog
}

func utilization(lambda, mu float64, slots int) float64 {
	if slots == 0 {
		return math.Inf(1)
	}
	return lambda / (float64(slots) * mu)
}

// sizeFor is the fewest replicas whose M/M/c p99 at lambda is within slo.
func sizeFor(lambda, mu float64, slots int, slo time.Duration) int {
	for n := 1; ; n++ {
		c := n * slots
		if lambda >= 0.98*float64(c)*mu {
			continue
		}
		if NewQueue(lambda, mu, c, 0).Quantile(0.99) <= slo.Seconds() {
			return n
		}
	}
}

// mixtureQuantile is the p-quantile of the response time over all
// requests of the run: the steps' distributions weighted by their requests.
func mixtureQuantile(qs []Queue, w []float64, p float64) float64 {
	sum := 0.0
	for _, x := range w {
		sum += x
	}
	return quantile(func(t float64) float64 {
		acc := 0.0
		for i, q := range qs {
			if w[i] > 0 {
				acc += w[i] * q.Tail(t)
			}
		}
		return acc / sum
	}, p)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
