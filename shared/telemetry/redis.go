package telemetry

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentRedis records a span per command and the client's command and
// connection-pool metrics with the given providers (never the globals).
// Pool counters are monotonic, as the database semantic conventions say.
func InstrumentRedis(rdb redis.UniversalClient, tp trace.TracerProvider, mp metric.MeterProvider) error {
	err := errors.Join(
		redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(tp)),
		redisotel.InstrumentMetrics(rdb, redisotel.WithMeterProvider(mp), redisotel.WithSemConvCompliantMetrics(true)),
	)
	if err != nil {
		return fmt.Errorf("telemetry: instrument redis: %w", err)
	}
	return nil
}
