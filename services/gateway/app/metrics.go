package app

import (
	"errors"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metric and attribute names of the gateway. Labels are low-cardinality:
// the route template, the method and the status, never tenants, keys or
// rental ids.
const (
	meterName         = "github.com/shizu-gpu/shizu/services/gateway"
	attrRoute         = attribute.Key("http.route")
	attrMethod        = attribute.Key("http.request.method")
	attrStatus        = attribute.Key("http.response.status_code")
	metricRequests    = "shizu.gateway.requests"
	metricDuration    = "shizu.gateway.request_duration"
	metricRateLimited = "shizu.gateway.rate_limited"
	metricReplayed    = "shizu.gateway.idempotent_replays"
	metricAuditLost   = "shizu.gateway.audit_records_lost"
)

// metrics are the gateway's instruments.
type metrics struct {
	requests    metric.Int64Counter
	duration    metric.Float64Histogram
	rateLimited metric.Int64Counter
	replayed    metric.Int64Counter
	auditLost   metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	var x metrics
	var errs [5]error
	x.requests, errs[0] = m.Int64Counter(metricRequests, metric.WithDescription("Calls answered (by route, method and status)."))
	x.duration, errs[1] = m.Float64Histogram(metricDuration, metric.WithUnit("s"),
		metric.WithDescription("Time to answer a call (an event stream: until it ended)."))
	x.rateLimited, errs[2] = m.Int64Counter(metricRateLimited, metric.WithDescription("Calls refused by a key's rate limit."))
	x.replayed, errs[3] = m.Int64Counter(metricReplayed, metric.WithDescription("POSTs answered with the first answer of their Idempotency-Key."))
	x.auditLost, errs[4] = m.Int64Counter(metricAuditLost, metric.WithDescription("State-changing calls whose audit record could not be stored."))
	return &x, errors.Join(errs[:]...)
}

func routeAttrs(route, method string, status int) metric.MeasurementOption {
	return metric.WithAttributes(attrRoute.String(route), attrMethod.String(method), attrStatus.String(strconv.Itoa(status)))
}
