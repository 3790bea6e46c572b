package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestHeartbeatKeyExpiresWhenTheNodeStopsBeating(t *testing.T) {
	t.Parallel()
	files := testkit.NewTLS(t)
	n := testkit.StartNATS(t, testkit.WithTLS(t, files), testkit.WithUsers(topology.Users(), password))
	admin := connect(t, serviceConfig(n, files, topology.Admin), bus.Instruments{})
	if _, err := admin.EnsureHeartbeats(t.Context(), topology.Heartbeats(1, time.Second)); err != nil {
		t.Fatal(err)
	}
	// The node agent beats, the failover watches: each with its own user.
	agentConn := connect(t, serviceConfig(n, files, topology.NodeAgent), bus.Instruments{})
	agent, err := agentConn.OpenHeartbeats(t.Context(), topology.HeartbeatBucket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	failConn := connect(t, serviceConfig(n, files, topology.Failover), bus.Instruments{})
	watcher, err := failConn.OpenHeartbeats(t.Context(), topology.HeartbeatBucket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	changes, err := watcher.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func() bus.HeartbeatChange {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no heartbeat change within 10s")
		}
		return bus.HeartbeatChange{}
	}

	for range 3 {
		if _, err := agent.Beat(t.Context(), "n1", []byte("epoch=1")); err != nil {
			t.Fatal(err)
		}
		if c := next(); c.Node != "n1" || !c.Alive || string(c.Payload) != "epoch=1" {
			t.Fatalf("beat seen as %+v", c)
		}
	}
	alive, payload, err := watcher.Alive(t.Context(), "n1")
	if err != nil || !alive || string(payload) != "epoch=1" {
		t.Fatalf("Alive = %v %q %v right after a beat", alive, payload, err)
	}
	lastBeat := time.Now()
	// No more beats: the key expires one TTL after the last one.
	c := next()
	if c.Node != "n1" || c.Alive {
		t.Fatalf("expected n1 to expire, got %+v", c)
	}
	if since := time.Since(lastBeat); since < 900*time.Millisecond {
		t.Fatalf("key expired %s after the last beat, before its 1s TTL", since)
	}
	if alive, _, err := watcher.Alive(t.Context(), "n1"); err != nil || alive {
		t.Fatalf("after expiry Alive = %v, %v", alive, err)
	}
	// A clean stop removes the key at once.
	if _, err := agent.Beat(t.Context(), "n2", nil); err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Node != "n2" || !c.Alive {
		t.Fatalf("got %+v", c)
	}
	if err := agent.Stop(t.Context(), "n2"); err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Node != "n2" || c.Alive {
		t.Fatalf("stop seen as %+v", c)
	}
	if _, err := agent.Beat(t.Context(), "bad.node", nil); err == nil {
		t.Fatal("a node id with a dot was accepted as a key")
	}
}

func TestHeartbeatBucketRejectsTTLBelowServerMinimum(t *testing.T) {
	t.Parallel()
	_, c := setup(t, bus.Instruments{})
	_, err := c.EnsureHeartbeats(t.Context(), bus.HeartbeatBucket{Name: "HB", TTL: 500 * time.Millisecond})
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a clear error about the 1s minimum", err)
	}
}
