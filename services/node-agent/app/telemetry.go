package app

import (
	"context"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// sample reads every GPU once, publishes NodeTelemetry, records the OTel
// gauges and applies the sample to GPU health.
func (a *nodeAgent) sample(ctx context.Context) {
	start := time.Now()
	samples, err := a.host.Sample(ctx, nil)
	a.m.sampleDur.Record(ctx, time.Since(start).Seconds())
	if err != nil {
		a.log.Warn("telemetry sample failed", "err", err)
		return
	}
	a.m.record(ctx, samples)
	a.mu.Lock()
	var changes []agent.HealthChange
	for _, s := range samples {
		changes = append(changes, a.health.Sample(s)...)
	}
	a.mu.Unlock()
	a.publishHealth(ctx, changes)
	ev := a.report.Telemetry(a.epochNow(), a.now(), samples)
	if err := a.publish(ctx, subject.NodeTelemetry, a.cfg.NodeID, ev); err != nil && ctx.Err() == nil {
		a.log.Warn("publish telemetry", "err", err)
	}
}

// watchHealth turns driver events into health changes, published at once.
func (a *nodeAgent) watchHealth(ctx context.Context) {
	events := make(chan gpu.Event, 64)
	done := make(chan error, 1)
	go func() { done <- a.host.Watch(ctx, events) }()
	for {
		select {
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				a.log.Error("GPU event watch stopped; health comes from telemetry only", "err", err)
			}
			return
		case ev := <-events:
			a.mu.Lock()
			changes := a.health.Event(ev)
			a.mu.Unlock()
			a.publishHealth(ctx, changes)
		}
	}
}

// publishHealth publishes each change in order, retrying each until the
// bus takes it (or ctx ends).
func (a *nodeAgent) publishHealth(ctx context.Context, changes []agent.HealthChange) {
	if len(changes) == 0 {
		return
	}
	epoch := a.epochNow()
	for _, c := range changes {
		a.log.Warn("health changed", "gpu", c.Index, "from", c.Previous, "to", c.Now, "xid", c.XID, "reason", c.Reason)
		ev := a.report.HealthChanged(epoch, c, a.now())
		_ = a.retry(ctx, "health change", func() error { return a.publish(ctx, subject.NodeHealth, a.cfg.NodeID, ev) })
	}
}
