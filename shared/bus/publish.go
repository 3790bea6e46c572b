package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/telemetry"
)

// Header names Shizu sets on every event.
const (
	// HeaderEvent carries the protobuf full name of the payload
	// (e.g. "shizu.v1.RentalRequested"), so consumers know how to decode it.
	HeaderEvent = "Shizu-Event"
	// HeaderMsgID is JetStream's deduplication id, set to the event id.
	HeaderMsgID = jetstream.MsgIDHeader
)

// Ack is the stream's confirmation of a publish.
type Ack struct {
	Stream   string
	Sequence uint64
	// Duplicate is true when the stream already held this event id.
	Duplicate bool
}

// ErrPermissionDenied is returned when the server refuses a publish because
// this service's user may not publish on the subject.
var ErrPermissionDenied = errors.New("permission denied")

// publishRetry bounds how long a publish keeps retrying transient failures
// (no stream responder during a leader change, timeouts, reconnects).
func publishRetry(ctx context.Context) backoff.BackOffContext {
	eb := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(20*time.Millisecond),
		backoff.WithMaxInterval(time.Second),
		backoff.WithMaxElapsedTime(10*time.Second))
	return backoff.WithContext(eb, ctx)
}

// EventID returns meta.event_id of a Shizu event (every event's first field
// is `EventMeta meta = 1`), or "" when ev has none.
func EventID(ev proto.Message) string {
	r := ev.ProtoReflect()
	fd := r.Descriptor().Fields().ByName("meta")
	if fd == nil || fd.Kind() != protoreflect.MessageKind || !r.Has(fd) {
		return ""
	}
	meta := r.Get(fd).Message()
	id := meta.Descriptor().Fields().ByName("event_id")
	if id == nil || id.Kind() != protoreflect.StringKind {
		return ""
	}
	return meta.Get(id).String()
}

// EventName returns the protobuf full name of ev, the value of HeaderEvent.
func EventName(ev proto.Message) string {
	return string(ev.ProtoReflect().Descriptor().FullName())
}

// Publish sends one event to subject and waits for the stream's ack. The
// event's meta.event_id becomes Nats-Msg-Id, so a retried or repeated
// publish is stored once. Transient failures are retried with exponential
// backoff; a permission or validation failure is returned at once.
func (c *Conn) Publish(ctx context.Context, subject string, ev proto.Message) (Ack, error) {
	msg, err := c.eventMsg(subject, ev)
	if err != nil {
		return Ack{}, err
	}
	return c.PublishMsg(ctx, msg)
}

// PublishMsg publishes a prepared message (its Nats-Msg-Id header must be
// set) with tracing and retries. Most callers want Publish.
func (c *Conn) PublishMsg(ctx context.Context, msg *nats.Msg) (Ack, error) {
	id := msg.Header.Get(HeaderMsgID)
	if id == "" {
		return Ack{}, fault.Invalid("publish to %s: no %s header: every event needs an id", msg.Subject, HeaderMsgID)
	}
	event := msg.Header.Get(HeaderEvent)
	ctx, span := c.startPublishSpan(ctx, msg, event, id)
	defer span.End()

	denied, stop := c.watchDenied(msg.Subject)
	defer stop()
	ack, err := backoff.RetryNotifyWithData(func() (Ack, error) {
		ack, err := c.publishOnce(ctx, msg, denied)
		if err != nil && !transient(err) {
			return Ack{}, backoff.Permanent(err)
		}
		return ack, err
	}, publishRetry(ctx), func(err error, next time.Duration) {
		c.metrics.retries.Add(ctx, 1, metric.WithAttributes(attrEvent.String(event)))
		c.log.WarnContext(ctx, "publish retry", "subject", msg.Subject, "msg_id", id, "err", err, "in", next)
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return Ack{}, fmt.Errorf("publish %s to %s: %w", id, msg.Subject, err)
	}
	span.SetAttributes(attribute.Int64("messaging.nats.stream_sequence", int64(ack.Sequence)),
		attribute.Bool("messaging.nats.duplicate", ack.Duplicate))
	c.metrics.published.Add(ctx, 1, metric.WithAttributes(attrEvent.String(event)))
	return ack, nil
}

// publishOnce sends msg and waits for the first of: the stream's ack, an
// error, a permission violation on the subject, or ctx. A refused publish
// gets no reply at all, so the violation the server reports out of band
// ends the wait.
func (c *Conn) publishOnce(ctx context.Context, msg *nats.Msg, denied <-chan error) (Ack, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		pa  *jetstream.PubAck
		err error
	}
	done := make(chan result, 1)
	go func() {
		pa, err := c.js.PublishMsg(ctx, msg)
		done <- result{pa, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return Ack{}, r.err
		}
		return Ack{Stream: r.pa.Stream, Sequence: r.pa.Sequence, Duplicate: r.pa.Duplicate}, nil
	case err := <-denied:
		cancel()
		<-done
		return Ack{}, fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	}
}

func (c *Conn) await(ctx context.Context, fut jetstream.PubAckFuture) (Ack, error) {
	select {
	case pa := <-fut.Ok():
		return Ack{Stream: pa.Stream, Sequence: pa.Sequence, Duplicate: pa.Duplicate}, nil
	case err := <-fut.Err():
		return Ack{}, err
	case <-ctx.Done():
		return Ack{}, ctx.Err()
	}
}

// transient reports whether retrying a failed publish can help.
func transient(err error) bool {
	if errors.Is(err, ErrPermissionDenied) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// The stream answered and refused (size limits, wrong expected
		// sequence, no stream for the subject): the same message fails again.
		return false
	}
	return true
}

// eventMsg builds the NATS message for an event: payload, event name and id
// headers. Trace context is added by PublishMsg.
func (c *Conn) eventMsg(subject string, ev proto.Message) (*nats.Msg, error) {
	id := EventID(ev)
	if id == "" {
		return nil, fault.Invalid("publish %s to %s: meta.event_id is empty", EventName(ev), subject)
	}
	data, err := proto.Marshal(ev)
	if err != nil {
		return nil, fault.Invalid("encode %s: %w", EventName(ev), err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(HeaderMsgID, id)
	msg.Header.Set(HeaderEvent, EventName(ev))
	return msg, nil
}

func (c *Conn) startPublishSpan(ctx context.Context, msg *nats.Msg, event, id string) (context.Context, trace.Span) {
	ctx, span := c.tracer.Start(ctx, "publish "+event,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", msg.Subject),
			attribute.String("messaging.message.id", id)))
	c.prop.Inject(ctx, telemetry.HeaderCarrier(msg.Header))
	return ctx, span
}

// Batch publishes many events without waiting for each ack in turn (async
// publish), for throughput. Wait collects the acks and retries, one by one
// with backoff, any publish that failed transiently.
type Batch struct {
	c       *Conn
	pending []pendingPublish
}

type pendingPublish struct {
	msg  *nats.Msg
	fut  jetstream.PubAckFuture
	span trace.Span
	ctx  context.Context
}

// NewBatch starts an async publish batch.
func (c *Conn) NewBatch() *Batch { return &Batch{c: c} }

// Publish queues one event. It returns an error only when the event cannot
// be encoded; delivery errors come from Wait.
func (b *Batch) Publish(ctx context.Context, subject string, ev proto.Message) error {
	msg, err := b.c.eventMsg(subject, ev)
	if err != nil {
		return err
	}
	ctx, span := b.c.startPublishSpan(ctx, msg, msg.Header.Get(HeaderEvent), msg.Header.Get(HeaderMsgID))
	fut, err := b.c.js.PublishMsgAsync(msg)
	if err != nil {
		fut = nil // retried synchronously in Wait
	}
	b.pending = append(b.pending, pendingPublish{msg: msg, fut: fut, span: span, ctx: ctx})
	return nil
}

// Len is the number of queued publishes.
func (b *Batch) Len() int { return len(b.pending) }

// Wait returns once every queued event is acknowledged, retrying failures
// synchronously; it returns the acks in queue order, or the first error.
func (b *Batch) Wait(ctx context.Context) ([]Ack, error) {
	acks := make([]Ack, len(b.pending))
	var firstErr error
	for i, p := range b.pending {
		var ack Ack
		err := errors.New("not sent")
		if p.fut != nil {
			ack, err = b.c.await(ctx, p.fut)
		}
		if err != nil && ctx.Err() == nil {
			// Resend through the synchronous path: same id, so a publish
			// that did land is reported as a duplicate, not stored twice.
			ack, err = b.c.PublishMsg(p.ctx, p.msg)
		} else if err == nil {
			b.c.metrics.published.Add(ctx, 1, metric.WithAttributes(attrEvent.String(p.msg.Header.Get(HeaderEvent))))
		}
		if err != nil {
			p.span.RecordError(err)
			p.span.SetStatus(codes.Error, err.Error())
			if firstErr == nil {
				firstErr = err
			}
		}
		p.span.End()
		acks[i] = ack
	}
	b.pending = b.pending[:0]
	return acks, firstErr
}
