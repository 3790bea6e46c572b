package app

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// A pool's decision and its events are committed together: the events go
// into the record's outbox in the same optimistic transaction as the
// state they follow from, and are published only after that transaction
// committed. Publishing inside the transaction would let a retried update
// (another handler or replica changed the pool first) leave events of an
// attempt that never took effect, under the ids its retry then reuses
// (the stream keeps the first). Every change flushes the outbox after its
// commit and publishes its own events; events a crashed replica left there
// go out with the pool's next tick (flush); their ids make a second
// publish a no-op.

// outboxEvent is one event waiting to be published.
type outboxEvent struct {
	ID      string `json:"id"`
	Subject string `json:"subject"`
	Type    string `json:"type"`
	Data    []byte `json:"data"`
	// Queued is when the change that made it was committed (this
	// machine's clock): flush leaves younger events to their own change.
	Queued time.Time `json:"queued"`
}

// leftAfter is how long an event stays in the outbox before the tick
// takes it for one whose change will never publish it.
const leftAfter = 10 * time.Second

// enqueue adds ev, to be published on subj once rec is committed.
func (rec *poolRecord) enqueue(subj string, ev interface {
	proto.Message
	GetMeta() *shizuv1.EventMeta
}) error {
	data, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode %s: %w", proto.MessageName(ev), err)
	}
	rec.Outbox = append(rec.Outbox, outboxEvent{ID: ev.GetMeta().GetEventId(), Subject: subj,
		Type: string(proto.MessageName(ev)), Data: data, Queued: time.Now()})
	return nil
}

// change updates pool's record with fn, then publishes the events the
// committed fn put in the outbox (only those: another change publishes its
// own) and removes them from it.
func (s *scaler) change(ctx context.Context, pool string, fn func(*poolRecord) error) error {
	var mine []outboxEvent
	err := s.states.update(ctx, pool, func(rec *poolRecord) error {
		before := len(rec.Outbox)
		mine = nil
		if err := fn(rec); err != nil {
			return err
		}
		mine = slices.Clone(rec.Outbox[min(before, len(rec.Outbox)):])
		return nil
	})
	if err != nil {
		return err
	}
	return s.publish(ctx, pool, mine)
}

// flush publishes what pool's outbox has held for longer than leftAfter:
// events of a change whose replica stopped between its commit and its
// publish. The pool tick calls it.
func (s *scaler) flush(ctx context.Context, pool string) error {
	rec, err := s.states.read(ctx, s.states.rdb, s.states.key(pool))
	if err != nil {
		return err
	}
	var left []outboxEvent
	for _, o := range rec.Outbox {
		if time.Since(o.Queued) > leftAfter {
			left = append(left, o)
		}
	}
	return s.publish(ctx, pool, left)
}

// publish publishes events, in order, then removes the published ones from
// pool's outbox.
func (s *scaler) publish(ctx context.Context, pool string, events []outboxEvent) error {
	if len(events) == 0 {
		return nil
	}
	published := map[string]bool{}
	for _, o := range events {
		ev, err := decodeOutbox(o)
		if err != nil {
			// Only this service writes the outbox; an entry that does not
			// decode can never be published and must not block the pool.
			s.log.ErrorContext(ctx, "dropping an outbox event that does not decode", "pool", pool, "event", o.ID, "err", err)
			published[o.ID] = true
			continue
		}
		if _, err := s.pub.Publish(ctx, o.Subject, ev); err != nil {
			return err // left in the outbox: the next tick publishes it
		}
		published[o.ID] = true
		if d, ok := ev.(*shizuv1.ScalingDecided); ok {
			s.m.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("shizu.rule", ruleKind(d.GetRule()))))
			s.log.InfoContext(ctx, "pool scaled", "pool", d.GetPoolId(), "from", d.GetFromReplicas(), "to", d.GetToReplicas(),
				"rule", d.GetRule(), "metric", d.GetMetric(), "observed", d.GetObservedValue(), "threshold", d.GetThreshold())
		}
	}
	return s.states.update(ctx, pool, func(rec *poolRecord) error {
		n := len(rec.Outbox)
		rec.Outbox = slices.DeleteFunc(rec.Outbox, func(o outboxEvent) bool { return published[o.ID] })
		if len(rec.Outbox) == n {
			return errNoChange
		}
		return nil
	})
}

// decodeOutbox is the event an outbox entry holds.
func decodeOutbox(o outboxEvent) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(o.Type))
	if err != nil {
		return nil, fmt.Errorf("outbox event %s: type %s: %w", o.ID, o.Type, err)
	}
	ev := mt.New().Interface()
	if err := proto.Unmarshal(o.Data, ev); err != nil {
		return nil, fmt.Errorf("outbox event %s: decode %s: %w", o.ID, o.Type, err)
	}
	return ev, nil
}
