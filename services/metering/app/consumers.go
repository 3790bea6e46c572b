package app

import (
	"context"
	"errors"
	"sync"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// consumerSet is the meter's running consumers, which a store rebuild
// pauses: while the store is lost every delivery would fail and be
// redelivered, and each redelivery counts towards the consumer's
// MaxDeliver, so a rebuild longer than the retry delays would dead-letter
// events metering must bill. Paused, the consumers pull nothing; what they
// had pulled fails once and comes back after the rebuild.
type consumerSet struct {
	m     *Meter
	specs []bus.Consumer
	// ctx is the context the consumers were first started with.
	ctx context.Context

	mu   sync.Mutex
	subs []*bus.Subscription
	// paused is true between pause and resume; stopped after Stop, which
	// no resume undoes.
	paused, stopped bool
}

// start starts every consumer of the set.
func (s *consumerSet) start(ctx context.Context) error {
	batch := bus.BatchOptions{MaxBatch: s.m.batch, Concurrency: s.m.opts.Concurrency, FastAck: s.m.opts.FastAck}
	var subs []*bus.Subscription
	for _, c := range s.specs {
		var sub *bus.Subscription
		var err error
		switch c.Stream {
		case topology.StreamRentals:
			sub, err = s.m.conn.ConsumeBatch(ctx, c, s.m.HandleRentals, batch)
		case topology.StreamMarket:
			r := bus.NewRouter()
			bus.On(r, s.m.HandleSpotPrice)
			sub, err = s.m.conn.Consume(ctx, c, r, s.m.opts)
		case topology.StreamBilling:
			sub, err = s.m.conn.ConsumeBatch(ctx, c, s.m.HandleUsage, batch)
		default:
			continue
		}
		if err != nil {
			return errors.Join(err, drain(ctx, subs))
		}
		subs = append(subs, sub)
	}
	s.subs = subs
	return nil
}

// pause drains the consumers (their in-flight deliveries finish); resume
// starts them again. Both are no-ops when already so.
func (s *consumerSet) pause(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return nil
	}
	s.paused = true
	err := drain(ctx, s.subs)
	s.subs = nil
	return err
}

func (s *consumerSet) resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused || s.stopped {
		return nil
	}
	if err := s.start(s.ctx); err != nil {
		return err
	}
	s.paused = false
	return nil
}

// Stop drains the consumers for good (service.Part).
func (s *consumerSet) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused, s.stopped = true, true
	err := drain(ctx, s.subs)
	s.subs = nil
	return err
}

// drain drains subs in reverse order.
func drain(ctx context.Context, subs []*bus.Subscription) error {
	var errs []error
	for i := len(subs) - 1; i >= 0; i-- {
		errs = append(errs, subs[i].Drain(ctx))
	}
	return errors.Join(errs...)
}
