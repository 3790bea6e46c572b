package app

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric and attribute names of the scheduler (labels are low-cardinality:
// no rental or node ids).
const (
	meterName      = "github.com/shizu-gpu/shizu/services/scheduler"
	attrOutcome    = attribute.Key("shizu.outcome")
	metricOutcomes = "shizu.scheduler.outcomes"
	metricLatency  = "shizu.scheduler.request_to_scheduled"
	metricConflict = "shizu.scheduler.reserve_conflicts"
	metricRefresh  = "shizu.scheduler.snapshot_refreshes"
	metricPreempt  = "shizu.scheduler.preemptions"
	metricFragAmt  = "shizu.scheduler.fragmentation.amount"
	metricFragRate = "shizu.scheduler.fragmentation.rate"
	metricAlloc    = "shizu.scheduler.allocation.ratio"
	metricClamped  = "shizu.scheduler.clamped_stops"
)

// Metrics are the scheduler's instruments; a nil *Metrics records nothing.
type Metrics struct {
	outcomes  metric.Int64Counter
	latencyH  metric.Float64Histogram
	conflicts metric.Int64Counter
	refreshes metric.Int64Counter
	preempts  metric.Int64Counter
	clamped   metric.Int64Counter
	// frag is the latest fragmentation measure of the replica's view,
	// published by the loop and read by the gauges' callback.
	frag atomic.Pointer[placement.FragStats]
}

// NewMetrics creates the instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter(meterName)
	var (
		x   Metrics
		err error
		e   []error
	)
	x.outcomes, err = m.Int64Counter(metricOutcomes, metric.WithDescription("Requests by outcome (scheduled, pending, rejected)."))
	e = append(e, err)
	x.latencyH, err = m.Float64Histogram(metricLatency, metric.WithUnit("s"),
		metric.WithDescription("From the request's occurred_at to its scheduled event being published."))
	e = append(e, err)
	x.conflicts, err = m.Int64Counter(metricConflict, metric.WithDescription("Reserves refused by the store and re-placed."))
	e = append(e, err)
	x.refreshes, err = m.Int64Counter(metricRefresh, metric.WithDescription("Full reads of the capacity store."))
	e = append(e, err)
	x.preempts, err = m.Int64Counter(metricPreempt, metric.WithDescription("Spot rentals preempted."))
	e = append(e, err)
	x.clamped, err = m.Int64Counter(metricClamped,
		metric.WithDescription("RentalStopped events stamped before their start (an agent's clock stepped back), handled as stops at their start."))
	e = append(e, err)
	amount, err := m.Float64ObservableGauge(metricFragAmt, metric.WithUnit("{GPU}"),
		metric.WithDescription("Expected fragmented GPU under the recent workload (FGD measure F(M)), in GPUs."))
	e = append(e, err)
	rate, err := m.Float64ObservableGauge(metricFragRate, metric.WithUnit("1"),
		metric.WithDescription("Fragmented share of the idle GPU (F(M) / idle), 0..1."))
	e = append(e, err)
	alloc, err := m.Float64ObservableGauge(metricAlloc, metric.WithUnit("1"),
		metric.WithDescription("Allocated share of the GPU capacity in the replica's view, 0..1."))
	e = append(e, err)
	for _, err := range e {
		if err != nil {
			return nil, err
		}
	}
	if _, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := x.frag.Load()
		if st == nil || st.CapacityMilli == 0 {
			return nil
		}
		o.ObserveFloat64(amount, st.FragMilli/placement.MilliPerGPU)
		o.ObserveFloat64(rate, st.RatePct()/100)
		o.ObserveFloat64(alloc, st.AllocationPct()/100)
		return nil
	}, amount, rate, alloc); err != nil {
		return nil, err
	}
	return &x, nil
}

// fragmentation publishes the view's measure to the gauges.
func (m *Metrics) fragmentation(st placement.FragStats) {
	if m != nil {
		m.frag.Store(&st)
	}
}

func (m *Metrics) outcome(ctx context.Context, o string) {
	if m != nil {
		m.outcomes.Add(ctx, 1, metric.WithAttributes(attrOutcome.String(o)))
	}
}

func (m *Metrics) latency(ctx context.Context, j *job, now time.Time) {
	if m != nil && !j.FromPending {
		m.latencyH.Record(ctx, now.Sub(j.Enqueued).Seconds())
	}
}

func (m *Metrics) conflict(ctx context.Context) {
	if m != nil {
		m.conflicts.Add(ctx, 1)
	}
}

func (m *Metrics) clampedStop(ctx context.Context) {
	if m != nil {
		m.clamped.Add(ctx, 1)
	}
}

func (m *Metrics) refreshed(ctx context.Context) {
	if m != nil {
		m.refreshes.Add(ctx, 1)
	}
}

func (m *Metrics) preempted(ctx context.Context) {
	if m != nil {
		m.preempts.Add(ctx, 1)
	}
}
