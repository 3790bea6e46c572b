package app

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metric and attribute names of metering. Labels are low-cardinality: plan
// and currency, never tenant, rental or node ids.
const (
	meterName       = "github.com/shizu-gpu/shizu/services/metering"
	attrPlan        = attribute.Key("shizu.plan")
	attrCurrency    = attribute.Key("shizu.currency")
	metricRecords   = "shizu.metering.records_published"
	metricAmount    = "shizu.metering.amount_published"
	metricApplied   = "shizu.metering.records_applied"
	metricDuplicate = "shizu.metering.records_duplicate"
	metricBudget    = "shizu.metering.budget_crossings"
	metricDue       = "shizu.metering.segments_closed_by_timer"
	metricLag       = "shizu.metering.watermark_lag"
	metricStepped   = "shizu.metering.stops_before_start"
	metricParked    = "shizu.metering.events_parked"
	metricGivenUp   = "shizu.metering.parked_given_up"
	metricAboveMax  = "shizu.metering.spot_seconds_above_max"
	metricRebuilds  = "shizu.metering.store_rebuilds"
	// metricQueries counts the money queries answered (query.go), by
	// query (usage, invoices, budget) and outcome (answered, invalid,
	// unavailable).
	metricQueries = "shizu.metering.queries"
	attrQuery     = attribute.Key("shizu.query")
	attrOutcome   = attribute.Key("shizu.outcome")
)

// metrics are metering's instruments.
type metrics struct {
	records    metric.Int64Counter
	amount     metric.Int64Counter
	applied    metric.Int64Counter
	duplicates metric.Int64Counter
	budget     metric.Int64Counter
	due        metric.Int64Counter
	lag        metric.Float64Gauge
	// steppedStops counts stops stamped before their start (a clock step
	// on the node), each ended at the last trusted time.
	steppedStops metric.Int64Counter
	// parked counts placements merged without their schedule (per batch
	// that merged one of their events); givenUp those dead-lettered.
	parked  metric.Int64Counter
	givenUp metric.Int64Counter
	// aboveMax counts spot seconds not billed for a price above the
	// tenant's maximum.
	aboveMax metric.Int64Counter
	// rebuilds counts rebuilds of a lost store from the streams.
	rebuilds metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	var x metrics
	var errs [12]error
	x.records, errs[0] = m.Int64Counter(metricRecords, metric.WithDescription("Usage records published (by plan)."))
	x.amount, errs[1] = m.Int64Counter(metricAmount, metric.WithUnit("{micro-unit}"),
		metric.WithDescription("Sum of the amounts of usage records published (by plan and currency)."))
	x.applied, errs[2] = m.Int64Counter(metricApplied, metric.WithDescription("Usage records folded into the aggregates."))
	x.duplicates, errs[3] = m.Int64Counter(metricDuplicate, metric.WithDescription("Usage records seen again and not counted."))
	x.budget, errs[4] = m.Int64Counter(metricBudget, metric.WithDescription("Budget thresholds crossed."))
	x.due, errs[5] = m.Int64Counter(metricDue, metric.WithDescription("Running segments looked at by the interval closer."))
	x.lag, errs[6] = m.Float64Gauge(metricLag, metric.WithUnit("s"),
		metric.WithDescription("How far the watermark (every rental and spot price event handled before it) trails the clock: running rentals are billed no later than it, so a growing lag is a metering backlog."))
	x.steppedStops, errs[7] = m.Int64Counter(metricStepped,
		metric.WithDescription("Stops stamped before their start (a clock step on the node): each run is ended at its start or what was already billed, and the stop dead-lettered for audit."))
	x.parked, errs[8] = m.Int64Counter(metricParked,
		metric.WithDescription("Starts and stops merged for a placement whose RentalScheduled has not been seen: parked until it comes."))
	x.givenUp, errs[9] = m.Int64Counter(metricGivenUp,
		metric.WithDescription("Parked placements given up after the park grace: not billed, dead-lettered with the reason and dropped."))
	x.aboveMax, errs[10] = m.Int64Counter(metricAboveMax, metric.WithUnit("s"),
		metric.WithDescription("Spot seconds not billed because the price in force was above the tenant's maximum (the rental ran unbilled)."))
	x.rebuilds, errs[11] = m.Int64Counter(metricRebuilds,
		metric.WithDescription("Rebuilds of metering's Redis state from the streams after it was lost (its marker missing), by this replica."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return &x, nil
}

func (m *metrics) published(ctx context.Context, plan, currency string, amount int64) {
	m.records.Add(ctx, 1, metric.WithAttributes(attrPlan.String(plan)))
	m.amount.Add(ctx, amount, metric.WithAttributes(attrPlan.String(plan), attrCurrency.String(currency)))
}

// newQueryCounter is the money queries' counter (metricQueries).
func newQueryCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	return mp.Meter(meterName).Int64Counter(metricQueries,
		metric.WithDescription("Money queries answered (by query and outcome: answered, invalid, unavailable)."))
}
