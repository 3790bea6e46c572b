package app

import (
	"context"
	"time"

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
)

// Metrics are the scheduler's instruments; a nil *Metrics records nothing.
type Metrics struct {
	outcomes  metric.Int64Counter
	latencyH  metric.Float64Histogram
	conflicts metric.Int64Counter
	refreshes metric.Int64Counter
	preempts  metric.Int64Counter
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
	for _, err := range e {
		if err != nil {
			return nil, err
		}
	}
	return &x, nil
}

func (m *Metrics) outcome(ctx context.Context, o string) {
	if m != nil {
		m.outcomes.Add(ctx, 1, metric.WithAttributes(attrOutcome.String(o)))
	}
}

func (m *Metrics) latency(ctx context.Context, j *job, now time.Time) {
	if m != nil && !j.fromPending {
		m.latencyH.Record(ctx, now.Sub(j.enqueued).Seconds())
	}
}

func (m *Metrics) conflict(ctx context.Context) {
	if m != nil {
		m.conflicts.Add(ctx, 1)
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
