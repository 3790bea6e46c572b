package app_test

import (
	"fmt"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// A NATS outage longer than the heartbeat TTL: the server stops, every
// key's TTL passes while it is down, and it restarts on its store. The
// healthy nodes, whose agents beat again once they reconnect, are not
// fenced and none of their rentals moves; the node whose agent died during
// the outage is fenced once the grace after the reconnect is over.
func TestANATSRestartLongerThanTheTTLFencesOnlyTheNodeThatDiedMeanwhile(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	e := newEnv(t, ttl)
	healthy := []string{"n1", "n2", "n3", "n4", "n5"}
	stops, epochs := map[string]func(){}, map[string]uint64{}
	var rentals []string
	for _, n := range append([]string{"n-dies"}, healthy...) {
		epoch := e.node(t, n, 2)
		r := "r-" + n
		e.rent(t, r, n, epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
		rentals = append(rentals, r)
		stops[n], epochs[n] = e.beat(t, n, epoch), epoch
	}
	cfg := testConfig()
	cfg.Sweep = 100 * time.Millisecond // the sweep suspects live nodes without a key, as deployed (every 10 s)
	e.startReplica(t, cfg, "failover-a", nil)
	waitIndexed(t, e, rentals...)

	e.NATS.Stop(t)
	for _, stop := range stops {
		stop() // no agent can beat while NATS is down; n-dies's agent dies meanwhile
	}
	waitUntil(t, time.Now().Add(3*ttl/2)) // the outage: every key's TTL passes while NATS is down
	e.NATS.Restart(t)
	eventually(t, func() error {
		if !e.Admin.NATS().IsConnected() {
			return fmt.Errorf("the agents' connection is not back yet")
		}
		return nil
	})
	// The healthy agents beat again a while after failover is back (but
	// within a TTL): a reconnect takes each client its own time.
	waitUntil(t, time.Now().Add(ttl/2))
	for _, n := range healthy {
		e.beat(t, n, epochs[n])
	}

	eventually(t, func() error {
		for _, l := range events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll) {
			if l.GetNodeId() == "n-dies" {
				return nil
			}
		}
		return fmt.Errorf("n-dies not fenced yet")
	})
	for _, l := range events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll) {
		if l.GetNodeId() != "n-dies" {
			t.Errorf("healthy node %s fenced after the NATS restart: %s", l.GetNodeId(), l.GetReason())
		}
	}
	for r := range migratingByRental(t, e) {
		if r != "r-n-dies" {
			t.Errorf("rental %s of a healthy node moved after the NATS restart", r)
		}
	}
	for _, n := range healthy {
		if st, err := e.store.Node(t.Context(), n); err != nil || st.Status != capacity.StatusReady || len(st.Allocations) != 1 {
			t.Errorf("healthy node %s after the restart: %s with %d allocations, %v", n, st.Status, len(st.Allocations), err)
		}
	}
}

// waitUntil waits until the clock passes at: how long an outage lasts.
func waitUntil(t testing.TB, at time.Time) {
	t.Helper()
	eventually(t, func() error {
		if left := time.Until(at); left > 0 {
			return fmt.Errorf("%s to go", left)
		}
		return nil
	})
}
