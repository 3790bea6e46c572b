package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/bus"
)

// consumedTime reads how far a durable has got through its stream: the
// server time before which it has acknowledged, so merged, every message
// it filters (docs/design/watermark.md).
type consumedTime struct {
	js              jetstream.JetStream
	stream, durable string

	mu   sync.Mutex
	cons jetstream.Consumer
	str  jetstream.Stream
}

func newConsumedTime(js jetstream.JetStream, c bus.Consumer) *consumedTime {
	return &consumedTime{js: js, stream: c.Stream, durable: c.Durable}
}

// lookup is the earliest of the consumer info's time and, per filter
// subject, the stored time of the first message after the ack floor,
// looked up even when nothing is pending (docs/design/watermark.md).
func (c *consumedTime) lookup(ctx context.Context) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fail := func(err error) (time.Time, error) {
		return time.Time{}, fmt.Errorf("watermark of %s/%s: %w", c.stream, c.durable, err)
	}
	if c.cons == nil {
		cons, err := c.js.Consumer(ctx, c.stream, c.durable)
		if err != nil {
			return fail(err)
		}
		c.cons = cons
	}
	info, err := c.cons.Info(ctx)
	if err != nil {
		return fail(err)
	}
	if info.TimeStamp.IsZero() {
		return fail(errors.New("the server gave no time with the consumer info"))
	}
	if c.str == nil {
		str, err := c.js.Stream(ctx, c.stream)
		if err != nil {
			return fail(err)
		}
		c.str = str
	}
	filters := info.Config.FilterSubjects
	if f := info.Config.FilterSubject; f != "" {
		filters = append(filters, f)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	at := info.TimeStamp
	for _, f := range filters {
		msg, err := c.str.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return fail(fmt.Errorf("first %s after %d: %w", f, info.AckFloor.Stream, err))
		case msg.Time.Before(at):
			at = msg.Time
		}
	}
	return at, nil
}

// watermark is the earliest consumed time of the meter's rental and spot
// price durables; it only moves forward (docs/design/watermark.md).
type watermark struct {
	of []*consumedTime

	mu sync.Mutex
	at time.Time // zero until the first lookup
}

// bounded says whether the watermark follows any durable. A meter started
// without the rental and spot durables (a test of the aggregates, a
// tool) bills by its clock alone.
func (w *watermark) bounded() bool { return len(w.of) > 0 }

// refresh looks every durable up; on any failure the watermark stays where
// it was.
func (w *watermark) refresh(ctx context.Context) error {
	var low time.Time
	for i, c := range w.of {
		t, err := c.lookup(ctx)
		if err != nil {
			return err
		}
		if i == 0 || t.Before(low) {
			low = t
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if low.After(w.at) {
		w.at = low
	}
	return nil
}

func (w *watermark) time() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at
}
