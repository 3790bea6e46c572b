package telemetry_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/shizu-gpu/shizu/shared/telemetry"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestInstrumentRedisUsesTheGivenProviders(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rdb := testkit.StartRedis(t).Client(t)

	require.NoError(t, telemetry.InstrumentRedis(rdb, tp, mp))
	ctx, parent := tp.Tracer("shizu.test").Start(t.Context(), "reserve")
	require.NoError(t, rdb.HSet(ctx, "cap:n1", "gpus", 8).Err())
	parent.End()

	var hset sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "hset" {
			hset = s
		}
	}
	require.NotNil(t, hset, "no hset span among %d", len(spans.Ended()))
	assert.Equal(t, parent.SpanContext().SpanID(), hset.Parent().SpanID())

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(t.Context(), &rm))
	var names []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names = append(names, m.Name)
		}
	}
	assert.Contains(t, names, "db.client.connections.use_time")
}
