package app

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// openHeartbeats opens the bucket the admin provisions, waiting for it.
func openHeartbeats(ctx context.Context, srt *service.Runtime, ttl time.Duration) (*bus.Heartbeats, error) {
	eb := backoff.NewExponentialBackOff(backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	return backoff.RetryNotifyWithData(func() (*bus.Heartbeats, error) {
		hb, err := srt.Bus.OpenHeartbeats(ctx, topology.HeartbeatBucket, ttl)
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, backoff.Permanent(err)
		}
		return hb, err
	}, backoff.WithContext(eb, ctx), func(err error, next time.Duration) {
		srt.Log.Warn("heartbeat bucket not provisioned yet; run `shizu provision` as admin", "err", err, "retry_in", next)
	})
}

// beatOnReconnect makes the agent beat as soon as its connection comes
// back: failover reads a disconnect advisory as a suspected crash and
// waits only a short grace (detect.Config.DisconnectGrace) for a beat
// that shows the agent alive, shorter than a heartbeat interval.
func (a *nodeAgent) beatOnReconnect(nc *nats.Conn) {
	prev := nc.Opts.ReconnectedCB // the bus's own (it logs the reconnect)
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		select {
		case a.beatNow <- struct{}{}:
		default:
		}
	})
}

// beatLoop beats every heartbeat interval, and at once when asked.
func (a *nodeAgent) beatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.beatNow:
		}
		a.beat(ctx)
	}
}

func (a *nodeAgent) beat(ctx context.Context) {
	if err := a.beats.Beat(ctx, a.cfg.NodeID, a.epochNow()); err != nil && ctx.Err() == nil {
		a.log.Warn("heartbeat failed", "err", err)
	}
}

// lease checks the node's registration (re-registering after a fence,
// restoring the node with its workloads into a store that was lost) and
// renews the running workloads' allocations.
func (a *nodeAgent) lease(ctx context.Context) {
	st, err := a.store.Node(ctx, a.cfg.NodeID)
	if err != nil && !capacity.IsNotFound(err) {
		a.log.Warn("capacity store unreachable", "err", err)
		return
	}
	// Read after the node: a store lost between the two reads shows here.
	lost, gerr := a.storeLost(ctx)
	if gerr != nil {
		a.log.Warn("capacity store unreachable", "err", gerr)
		return
	}
	stored := agent.StoredNode{Found: err == nil, Dead: st.Status == capacity.StatusDead, Epoch: int64(st.Epoch)}
	switch epoch := a.epochNow(); {
	case lost:
		a.log.Warn("the capacity store was lost; restoring the node with its workloads", "epoch", epoch)
		if err := a.restore(ctx, epoch, a.runningList(), nil); err != nil {
			a.log.Error("restore failed", "err", err)
			return
		}
	case agent.MustRegister(stored, epoch):
		a.log.Warn("registration lost or fenced; registering again", "epoch", epoch, "err", err)
		if err := a.register(ctx); err != nil {
			a.log.Error("re-registration failed", "err", err)
			return
		}
	}
	a.renew(ctx)
	a.checkDrained(ctx)
}

// renew asks the store about every running workload and stops those that
// must not run any more. Before it stops any it checks that the store is
// still the one the node registered in: one lost since the lease began
// answers "gone" for everything, and the next lease restores it instead.
func (a *nodeAgent) renew(ctx context.Context) {
	a.mu.Lock()
	running := make([]agent.Rental, 0, len(a.running))
	for id, r := range a.running {
		if _, stopping := a.stopping[id]; !stopping {
			running = append(running, r)
		}
	}
	a.mu.Unlock()
	verdicts := map[string]agent.Allocation{}
	var known []agent.Rental
	for _, r := range running {
		switch err := a.store.Renew(ctx, r.RentalID, a.cfg.NodeID, uint64(r.Epoch)); {
		case err == nil:
			verdicts[r.RentalID] = agent.AllocationValid
		case capacity.IsFenced(err):
			verdicts[r.RentalID] = agent.AllocationFenced
		case capacity.IsNotFound(err):
			verdicts[r.RentalID] = agent.AllocationGone
		default:
			a.log.Warn("renew failed", "rental", r.RentalID, "err", err)
			continue
		}
		known = append(known, r)
	}
	stops := agent.Reconcile(known, verdicts)
	if len(stops) == 0 {
		return
	}
	if lost, err := a.storeLost(ctx); err != nil || lost {
		a.log.Warn("not stopping workloads: the capacity store was lost or is unreachable", "workloads", len(stops), "err", err)
		return
	}
	a.stopWorkloads(ctx, stops)
}

// checkDrained publishes NodeDrained once a draining node holds nothing.
func (a *nodeAgent) checkDrained(ctx context.Context) {
	a.mu.Lock()
	due := a.drain.Due(len(a.running))
	drain, epoch := a.drain, a.epoch
	a.mu.Unlock()
	if !due {
		return
	}
	allocs, err := a.store.Allocations(ctx, a.cfg.NodeID)
	if err != nil || len(allocs) > 0 {
		return
	}
	ev := a.report.Drained(epoch, drain, a.now())
	if err := a.publish(ctx, subject.NodeDrained, a.cfg.NodeID, ev); err != nil {
		a.log.Warn("publish drained", "err", err)
		return
	}
	a.mu.Lock()
	a.drain.Announced = true
	a.mu.Unlock()
	a.log.Info("node drained")
}
