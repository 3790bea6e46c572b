package bus

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shizu-gpu/shizu/shared/fault"
)

// BatchHandlerFunc processes deliveries together, so their effects can
// share round trips (one Redis pipeline, one async publish batch). It
// returns one outcome per delivery, in order, with the meaning of a
// HandlerFunc's error: nil acks, fault.ErrInvalid dead-letters, anything
// else redelivers after a backoff delay. A nil slice acks every delivery.
//
// A delivery is acknowledged only after the handler returned, so its
// effects must be durable by then; as with FastAck, a lost ack redelivers,
// which the handler must absorb (its effects idempotent on the event id).
type BatchHandlerFunc func(ctx context.Context, ds []Delivery) []error

// BatchOptions tune a batch subscription.
type BatchOptions struct {
	// MaxBatch is the most deliveries handed to the handler at once
	// (default 500). A batch holds what has arrived; it never waits to fill.
	MaxBatch int
	// Concurrency is how many batches are handled at once (default 1).
	Concurrency int
	// RetryDelays and FastAck are as in ConsumeOptions.
	RetryDelays []time.Duration
	FastAck     bool
	// Unusable, when set, is told of each delivery dead-lettered before
	// the handler saw it (reason: no type, a contradicted type, a body
	// naming another tenant than its subject), before its dead letter is
	// stored, so the service can answer the sender (the scheduler rejects
	// a forged request to its subject's tenant). d.Event is the subject's
	// type when it was consistent, else "unusable".
	Unusable func(ctx context.Context, d Delivery, reason error)
}

// ConsumeBatch is Consume for a handler of batches. A delivery's Event is
// the type its subject carries (see Carried); a delivery without a type,
// whose Shizu-Event header its subject contradicts, or whose body names
// another tenant than its subject (TenantMismatch) is dead-lettered before
// the handler sees it. A type the handler does not handle must get an error
// (Unhandled), not nil. Exhausted deliveries are forwarded to the dead
// letters as with Consume.
func (c *Conn) ConsumeBatch(ctx context.Context, spec Consumer, h BatchHandlerFunc, opts BatchOptions) (*Subscription, error) {
	cons, err := c.EnsureConsumer(ctx, spec)
	if err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 500
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	s := newSubscription(opts.MaxBatch)
	w := &worker{c: c, spec: spec, opts: ConsumeOptions{RetryDelays: opts.RetryDelays, FastAck: opts.FastAck}, unusable: opts.Unusable}
	hctx := context.WithoutCancel(ctx)
	for range opts.Concurrency {
		s.workers.Add(1)
		go func() {
			defer s.workers.Done()
			batch := make([]jetstream.Msg, 0, opts.MaxBatch)
			for m := range s.queue {
				batch = append(batch[:0], m)
			fill:
				for len(batch) < opts.MaxBatch {
					select {
					case m, ok := <-s.queue:
						if !ok {
							break fill
						}
						batch = append(batch, m)
					default:
						break fill
					}
				}
				w.handleBatch(hctx, h, batch)
				clear(batch)
			}
		}()
	}
	pull := min(max(64, 2*opts.MaxBatch*opts.Concurrency), spec.MaxAckPending)
	if err := c.pull(ctx, s, cons, spec, pull, true); err != nil {
		return nil, err
	}
	return s, nil
}

func (w *worker) handleBatch(ctx context.Context, h BatchHandlerFunc, msgs []jetstream.Msg) {
	ds := make([]Delivery, 0, len(msgs))
	kept := msgs[:0:len(msgs)]
	for _, m := range msgs {
		md, err := m.Metadata()
		if err != nil {
			w.c.log.Error("delivery without metadata", "consumer", w.spec.Durable, "err", err)
			_ = m.Nak()
			continue
		}
		hdr := m.Headers()
		d := Delivery{Subject: m.Subject(), Event: hdr.Get(HeaderEvent), MsgID: hdr.Get(HeaderMsgID),
			Header: hdr, Data: m.Data(), Delivered: md.NumDelivered, StreamSeq: md.Sequence.Stream}
		want, declared := EventOn(d.Subject)
		event, err := typeOf(d, want, declared)
		if err == nil {
			err = TenantMismatch(d.Subject, event, d.Data)
		}
		if err != nil { // unusable: never handed to the handler
			d.Event = cmp.Or(event, unusableEvent)
			if w.unusable != nil {
				w.unusable(ctx, d, err)
			}
			w.deadLetter(ctx, m, d, err.Error())
			continue
		}
		d.Event = event
		ds = append(ds, d)
		kept = append(kept, m)
	}
	if len(ds) == 0 {
		return
	}
	ctx, span := w.c.tracer.Start(ctx, "process batch "+w.spec.Durable,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.consumer.group.name", w.spec.Durable),
			attribute.Int("messaging.batch.message_count", len(ds))))
	defer span.End()
	start := time.Now()
	outcomes := h(ctx, ds)
	w.c.metrics.handle.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(attrConsumer.String(w.spec.Durable), attrEvent.String("batch")))
	if outcomes != nil && len(outcomes) != len(ds) {
		err := fmt.Errorf("batch handler returned %d outcomes for %d deliveries", len(outcomes), len(ds))
		span.SetStatus(codes.Error, err.Error())
		w.c.log.ErrorContext(ctx, "batch handler broke its contract; redelivering", "consumer", w.spec.Durable, "err", err)
		for i, m := range kept {
			_ = m.NakWithDelay(w.opts.RetryDelay(ds[i].Delivered))
		}
		return
	}
	var acked []jetstream.Msg
	ackedBy := map[string]int64{} // counted once per event name, not per delivery
	for i, m := range kept {
		var herr error
		if outcomes != nil {
			herr = outcomes[i]
		}
		d := ds[i]
		switch {
		case herr == nil:
			acked = append(acked, m)
			ackedBy[d.Event]++
		case fault.IsInvalid(herr):
			span.SetStatus(codes.Error, herr.Error())
			w.deadLetter(ctx, m, d, herr.Error())
		case int(d.Delivered) >= w.spec.MaxDeliver:
			span.SetStatus(codes.Error, herr.Error())
			w.deadLetter(ctx, m, d, fmt.Sprintf("max deliveries (%d) reached; last error: %v", w.spec.MaxDeliver, herr))
		default:
			span.RecordError(herr)
			delay := w.opts.RetryDelay(d.Delivered)
			w.c.log.WarnContext(ctx, "handler failed; redelivering", "consumer", w.spec.Durable, "event", d.Event,
				"msg_id", d.MsgID, "delivered", d.Delivered, "in", delay, "err", herr)
			w.count(ctx, outcomeRetry, d.Event)
			if err := m.NakWithDelay(delay); err != nil {
				w.c.log.ErrorContext(ctx, "nak failed; the server redelivers after ack wait", "consumer", w.spec.Durable, "err", err)
			}
		}
	}
	w.ackAll(ctx, acked)
	for event, n := range ackedBy {
		w.c.metrics.consumed.Add(ctx, n, metric.WithAttributes(
			attrConsumer.String(w.spec.Durable), attrOutcome.String(outcomeAck), attrEvent.String(event)))
	}
}

// ackAll acknowledges msgs: at once when FastAck, else all confirmations
// awaited together.
func (w *worker) ackAll(ctx context.Context, msgs []jetstream.Msg) {
	if w.opts.FastAck || len(msgs) < 2 {
		for _, m := range msgs {
			w.ack(ctx, m)
		}
		return
	}
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Go(func() { w.ack(ctx, m) })
	}
	wg.Wait()
}
