package app

import (
	"context"
	"time"

	"github.com/shizu-gpu/shizu/shared/service"
)

// startCloser runs CloseDue every tick until the returned part is stopped;
// Stop waits for a close in progress (within its ctx).
func (m *Meter) startCloser(ctx context.Context, tick time.Duration) service.Part {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := m.CloseDue(ctx); err != nil && ctx.Err() == nil {
					m.log.WarnContext(ctx, "closing due usage failed", "err", err)
				}
			}
		}
	}()
	return service.PartFunc(func(stopCtx context.Context) error {
		cancel()
		select {
		case <-done:
			return nil
		case <-stopCtx.Done():
			return stopCtx.Err()
		}
	})
}
