package app

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shizu-gpu/shizu/shared/bus"
)

// A NATS outage is not a node outage: while failover's connection is
// down it sees no beat, and a restarted server expires every key whose TTL
// passed meanwhile. So failover tells the detector when it stops seeing
// the heartbeats (the connection drops) and when it sees them again (a new
// watch, started after the reconnect, replays every live key); the
// detector judges no missing beat in between, nor for one TTL after (see
// detect.Detector.Observed). The watch is restarted rather than left to
// resume: the client's ordered consumer would only notice the restarted
// server after its idle heartbeats were missed (about 10 s), and by then
// the expiry markers (kept 1 s) are gone.

// A JetStream outage can leave the connection up (a lost meta leader, a
// full store, JetStream turned off): the watch then simply goes quiet. So
// failover also asks the bucket whether it serves, several times a TTL;
// while it does not, failover is as blind as when disconnected, and once
// it serves again the watch is restarted as after a reconnect.

// watchJetStream probes the heartbeat bucket every interval until ctx
// ends; the returned channel is signalled when it serves again after
// not serving.
func (f *Failover) watchJetStream(ctx context.Context, interval time.Duration) <-chan struct{} {
	back := make(chan struct{}, 1)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		blind := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			pctx, cancel := context.WithTimeout(ctx, interval)
			err := f.d.Heartbeats.Serving(pctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil && !blind:
				blind = true
				f.unobserved()
				f.d.Log.WarnContext(ctx, "the heartbeat bucket does not serve; no missing beat is judged until it does", "err", err)
			case err == nil && blind:
				blind = false
				select {
				case back <- struct{}{}:
				default:
				}
			}
		}
	}()
	return back
}

// watchConnection chains failover's sight onto the bus connection's
// disconnect and reconnect handlers (the bus's own still run first); a
// reconnect is signalled on the returned channel.
func (f *Failover) watchConnection() <-chan struct{} {
	nc := f.d.Bus.NATS()
	back := make(chan struct{}, 1)
	prevDown, prevBack := nc.DisconnectErrHandler(), nc.ReconnectHandler()
	nc.SetDisconnectErrHandler(func(c *nats.Conn, err error) {
		if prevDown != nil {
			prevDown(c, err)
		}
		f.unobserved()
	})
	nc.SetReconnectHandler(func(c *nats.Conn) {
		if prevBack != nil {
			prevBack(c)
		}
		select {
		case back <- struct{}{}:
		default:
		}
	})
	return back
}

func (f *Failover) unobserved() {
	now := f.d.Now()
	f.mu.Lock()
	f.det.Unobserved(now)
	f.mu.Unlock()
}

// heartbeatWatch is the current watch of the heartbeat bucket.
type heartbeatWatch struct {
	changes <-chan bus.HeartbeatChange
	stop    context.CancelFunc
}

// watchHeartbeats (re)starts the watch, retrying until it is up or ctx
// ends; then the detector observes again (a restart stays blind until
// then). The first watch of a replica gives no grace: it has no beats to
// have missed, and the sweep finds the nodes that died before it started.
func (f *Failover) watchHeartbeats(ctx context.Context, old heartbeatWatch) (heartbeatWatch, error) {
	if old.stop != nil {
		old.stop()
		f.unobserved()
		f.d.Metrics.watchRestarted(ctx)
	}
	for {
		wctx, stop := context.WithCancel(ctx)
		changes, err := f.d.Heartbeats.Watch(wctx)
		if err == nil {
			now := f.d.Now()
			f.mu.Lock()
			f.det.Observed(now)
			f.mu.Unlock()
			if old.stop != nil {
				f.d.Log.InfoContext(ctx, "watching heartbeats again; missing beats are judged after the grace", "grace", f.cfg.Detect.Grace)
			}
			return heartbeatWatch{changes: changes, stop: stop}, nil
		}
		stop()
		f.d.Log.WarnContext(ctx, "heartbeat watch failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return heartbeatWatch{}, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
