//go:build !race

// The race detector is off for this file: turning JetStream off and on
// in a running nats-server (v2.15.2) races with its own API dispatch
// (Server.setJetStreamExportSubs against jetStream.apiDispatch), a race
// inside the server that no client can avoid. scripts/test.sh runs this
// file's test once more without -race.

package app_test

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// A JetStream outage that leaves the connections up (the server is
// reachable, its streams and buckets are not): no beat can be written or
// seen, but that says nothing of the nodes. Failover notices the bucket
// is not serving, judges no missing beat while it is down nor for one TTL
// after it serves again, and fences no healthy node.
func TestAJetStreamOutageWithTheConnectionUpFencesNoHealthyNode(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	e := newEnv(t, ttl)
	nodes := []string{"n1", "n2", "n3"}
	var rentals []string
	stops, epochs := map[string]func(){}, map[string]uint64{}
	for _, n := range nodes {
		epoch := e.node(t, n, 2)
		r := "r-" + n
		e.rent(t, r, n, epoch, shizuv1.Plan_PLAN_ON_DEMAND, 0)
		rentals = append(rentals, r)
		stops[n], epochs[n] = e.beat(t, n, epoch), epoch
	}
	cfg := testConfig()
	cfg.Sweep = 100 * time.Millisecond
	e.startReplica(t, cfg, "failover-a", nil)
	waitIndexed(t, e, rentals...)

	e.NATS.StopJetStream(t)
	for _, stop := range stops {
		stop() // no beat can be written while JetStream is down
	}
	waitUntil(t, time.Now().Add(3*ttl/2)) // longer than the TTL
	e.NATS.StartJetStream(t)
	// The agents' next beats come a while after the bucket serves again
	// (within a TTL): their retries back off.
	waitUntil(t, time.Now().Add(ttl/2))
	for _, n := range nodes {
		e.beat(t, n, epochs[n])
	}
	waitUntil(t, time.Now().Add(2*ttl)) // the grace after the outage passes

	for _, l := range events[*shizuv1.NodeLost](t, e, topology.StreamNodes, subject.NodeLostAll) {
		t.Errorf("healthy node %s fenced after a JetStream outage: %s", l.GetNodeId(), l.GetReason())
	}
	for r := range migratingByRental(t, e) {
		t.Errorf("rental %s of a healthy node moved after a JetStream outage", r)
	}
	for _, n := range nodes {
		if st, err := e.store.Node(t.Context(), n); err != nil || st.Status != capacity.StatusReady || len(st.Allocations) != 1 {
			t.Errorf("healthy node %s after the outage: %s with %d allocations, %v", n, st.Status, len(st.Allocations), err)
		}
	}
}
