package telemetry_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/shizu-gpu/shizu/shared/telemetry"
)

func TestHeaderCarrierExtractsTraceparentWhateverItsCase(t *testing.T) {
	t.Parallel()
	prop := propagation.TraceContext{}
	sent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	injected := nats.Header{}
	prop.Inject(trace.ContextWithSpanContext(t.Context(), sent), telemetry.HeaderCarrier(injected))
	traceparent := telemetry.HeaderCarrier(injected).Get("traceparent")
	require.NotEmpty(t, traceparent)

	for name, h := range map[string]nats.Header{
		"as injected":                  injected,
		"lowercased by another client": {"traceparent": {traceparent}},
		"canonicalised by http.Header": {"Traceparent": {traceparent}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := trace.SpanContextFromContext(prop.Extract(t.Context(), telemetry.HeaderCarrier(h)))
			assert.True(t, got.IsValid())
			assert.True(t, got.IsRemote())
			assert.True(t, sent.Equal(got.WithRemote(false)), "got %v, want %v", got, sent)
		})
	}
}

func TestHeaderCarrierListsEveryKey(t *testing.T) {
	t.Parallel()
	h := nats.Header{"traceparent": {"x"}, "Nats-Msg-Id": {"e-1"}}
	assert.ElementsMatch(t, []string{"traceparent", "Nats-Msg-Id"}, telemetry.HeaderCarrier(h).Keys())
}
