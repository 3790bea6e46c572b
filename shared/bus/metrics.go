package bus

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instrumentationName names the bus's tracer and meter.
const instrumentationName = "github.com/shizu-gpu/shizu/shared/bus"

// Attribute keys. Values are low-cardinality: event types, consumer names
// and outcomes, never subjects (they carry tenant and node ids).
const (
	attrEvent    = attribute.Key("shizu.event")
	attrConsumer = attribute.Key("shizu.consumer")
	attrOutcome  = attribute.Key("shizu.outcome")
)

// Consume outcomes.
const (
	outcomeAck        = "ack"
	outcomeRetry      = "retry"
	outcomeDeadLetter = "dead_letter"
	// A dead-letter copy could not be stored; the message is redelivered.
	outcomeDeadLetterFailed = "dead_letter_failed"
	// No copy could be stored on the last delivery either: terminated, and
	// kept only in its own stream.
	outcomeTerminated = "terminated_without_copy"
)

// unusableEvent labels a delivery whose event type could not be decided
// (no type, or a header its subject contradicts).
const unusableEvent = "unusable"

type metrics struct {
	published metric.Int64Counter
	retries   metric.Int64Counter
	consumed  metric.Int64Counter
	handle    metric.Float64Histogram
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter(instrumentationName)
	var err error
	var out metrics
	if out.published, err = m.Int64Counter("shizu.bus.published",
		metric.WithDescription("Events acknowledged by a stream, duplicates included."), metric.WithUnit("{event}")); err != nil {
		return nil, err
	}
	if out.retries, err = m.Int64Counter("shizu.bus.publish.retries",
		metric.WithDescription("Publish attempts retried after a transient failure."), metric.WithUnit("{attempt}")); err != nil {
		return nil, err
	}
	if out.consumed, err = m.Int64Counter("shizu.bus.consumed",
		metric.WithDescription("Deliveries handled, by outcome (ack, retry, dead_letter, dead_letter_failed, terminated_without_copy)."), metric.WithUnit("{delivery}")); err != nil {
		return nil, err
	}
	if out.handle, err = m.Float64Histogram("shizu.bus.handle.duration",
		metric.WithDescription("Time a handler spent on one delivery."), metric.WithUnit("s")); err != nil {
		return nil, err
	}
	return &out, nil
}
