package app

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric and attribute names of failover. Labels are low-cardinality: no
// rental or node ids.
const (
	meterName = "github.com/shizu-gpu/shizu/services/failover"

	attrReason  = attribute.Key("shizu.reason")
	attrOutcome = attribute.Key("shizu.outcome")

	metricDetection      = "shizu.failover.detection"
	metricFenceScheduled = "shizu.failover.fence_to_scheduled"
	metricDowntime       = "shizu.failover.downtime"
	metricFences         = "shizu.failover.fences"
	metricMigrations     = "shizu.failover.migrations"
	metricMoveFailures   = "shizu.failover.move_failures"
	metricQuarantines    = "shizu.failover.quarantines"
	metricWatchRestarts  = "shizu.failover.heartbeat_watch_restarts"
	metricClampedStops   = "shizu.failover.clamped_stops"
)

// Metrics are failover's instruments; a nil *Metrics records nothing.
type Metrics struct {
	detection      metric.Float64Histogram
	fenceScheduled metric.Float64Histogram
	downtime       metric.Float64Histogram
	fences         metric.Int64Counter
	migrations     metric.Int64Counter
	moveFailures   metric.Int64Counter
	quarantines    metric.Int64Counter
	watchRestarts  metric.Int64Counter
	clampedStops   metric.Int64Counter
}

// NewMetrics creates the instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	m := mp.Meter(meterName)
	var x Metrics
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	x.detection, err = m.Float64Histogram(metricDetection, metric.WithUnit("s"),
		metric.WithDescription("From a lost node's last sign of life to the loss being decided, by reason."))
	add(err)
	x.fenceScheduled, err = m.Float64Histogram(metricFenceScheduled, metric.WithUnit("s"),
		metric.WithDescription("From the failure being decided (fence, or GPU failure) to a moved rental's new RentalScheduled."))
	add(err)
	x.downtime, err = m.Float64Histogram(metricDowntime, metric.WithUnit("s"),
		metric.WithDescription("Per moved rental: from its last sign of life on the old node to its start on the new one."))
	add(err)
	x.fences, err = m.Int64Counter(metricFences,
		metric.WithDescription("Fence attempts by outcome: won (this replica fenced), lost (another replica or a new registration came first)."))
	add(err)
	x.migrations, err = m.Int64Counter(metricMigrations, metric.WithDescription("Rentals handed to the scheduler to move, by reason."))
	add(err)
	x.moveFailures, err = m.Int64Counter(metricMoveFailures,
		metric.WithDescription("Moves that can never be handed to the scheduler (invalid input), by reason; the rental stays on its old node."))
	add(err)
	x.quarantines, err = m.Int64Counter(metricQuarantines, metric.WithDescription("Flapping nodes quarantined."))
	add(err)
	x.watchRestarts, err = m.Int64Counter(metricWatchRestarts,
		metric.WithDescription("Heartbeat watches restarted after failover's NATS connection came back (each followed by one TTL of grace)."))
	add(err)
	x.clampedStops, err = m.Int64Counter(metricClampedStops,
		metric.WithDescription("RentalStopped events whose stopped_at is before their started_at (an agent's clock stepped back), handled as stops."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &x, nil
}

func (m *Metrics) detected(ctx context.Context, reason string, d time.Duration) {
	if m != nil {
		m.detection.Record(ctx, d.Seconds(), metric.WithAttributes(attrReason.String(reason)))
	}
}

func (m *Metrics) scheduled(ctx context.Context, d time.Duration) {
	if m != nil {
		m.fenceScheduled.Record(ctx, max(d, 0).Seconds())
	}
}

func (m *Metrics) migrated(ctx context.Context, reason string, d time.Duration) {
	if m != nil {
		m.downtime.Record(ctx, d.Seconds(), metric.WithAttributes(attrReason.String(reason)))
	}
}

func (m *Metrics) fence(ctx context.Context, outcome string) {
	if m != nil {
		m.fences.Add(ctx, 1, metric.WithAttributes(attrOutcome.String(outcome)))
	}
}

func (m *Metrics) migrating(ctx context.Context, reason string) {
	if m != nil {
		m.migrations.Add(ctx, 1, metric.WithAttributes(attrReason.String(reason)))
	}
}

func (m *Metrics) moveFailed(ctx context.Context, reason string) {
	if m != nil {
		m.moveFailures.Add(ctx, 1, metric.WithAttributes(attrReason.String(reason)))
	}
}

func (m *Metrics) quarantined(ctx context.Context) {
	if m != nil {
		m.quarantines.Add(ctx, 1)
	}
}

func (m *Metrics) watchRestarted(ctx context.Context) {
	if m != nil {
		m.watchRestarts.Add(ctx, 1)
	}
}

func (m *Metrics) clampedStop(ctx context.Context) {
	if m != nil {
		m.clampedStops.Add(ctx, 1)
	}
}
