package telemetry

import (
	"context"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// NewLogHandler wraps inner so that a record logged with a context holding a
// valid span carries trace_id and span_id. The two attributes stay at the top
// level even under WithGroup, where log backends look for them.
func NewLogHandler(inner slog.Handler) slog.Handler {
	return &traceLogHandler{top: inner, inner: inner}
}

type traceLogHandler struct {
	top    slog.Handler                      // inner before the first WithGroup
	inner  slog.Handler                      // top with groups applied
	groups []func(slog.Handler) slog.Handler // WithGroup and later WithAttrs calls, replayed on top
}

func (h *traceLogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *traceLogHandler) Handle(ctx context.Context, r slog.Record) error {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return h.inner.Handle(ctx, r)
	}
	ids := []slog.Attr{
		slog.String("trace_id", sc.TraceID().String()),
		slog.String("span_id", sc.SpanID().String()),
	}
	if len(h.groups) == 0 {
		r = r.Clone()
		r.AddAttrs(ids...)
		return h.inner.Handle(ctx, r)
	}
	out := h.top.WithAttrs(ids)
	for _, apply := range h.groups {
		out = apply(out)
	}
	return out.Handle(ctx, r)
}

func (h *traceLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(h.groups) == 0 {
		return NewLogHandler(h.inner.WithAttrs(attrs))
	}
	return h.with(func(x slog.Handler) slog.Handler { return x.WithAttrs(attrs) })
}

func (h *traceLogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(func(x slog.Handler) slog.Handler { return x.WithGroup(name) })
}

func (h *traceLogHandler) with(apply func(slog.Handler) slog.Handler) *traceLogHandler {
	return &traceLogHandler{
		top:    h.top,
		inner:  apply(h.inner),
		groups: append(slices.Clip(h.groups), apply),
	}
}
