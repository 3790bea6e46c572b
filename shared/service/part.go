package service

import (
	"context"
	"time"
)

// PartFunc adapts a stop function to a Part: the function finishes the
// part's in-flight work within ctx.
type PartFunc func(ctx context.Context) error

// Stop calls f.
func (f PartFunc) Stop(ctx context.Context) error { return f(ctx) }

// Loop is a Part that calls fn every period until it is stopped or the ctx
// it was started with ends. fn gets the loop's context and the tick's
// time; a call in progress at Stop finishes (within Stop's ctx) before
// Stop returns.
type Loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartLoop starts a Loop calling fn every period (period > 0).
func StartLoop(ctx context.Context, every time.Duration, fn func(ctx context.Context, now time.Time)) *Loop {
	ctx, cancel := context.WithCancel(ctx)
	l := &Loop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				fn(ctx, now)
			}
		}
	}()
	return l
}

// Stop ends the loop and waits, within ctx, for a call in progress.
func (l *Loop) Stop(ctx context.Context) error {
	l.cancel()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
