package testkit

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/embednats"
)

// Stop shuts the server down, keeping its store directory: its clients
// see the connection drop and reconnect (bus.Connect's do, forever) until
// Restart. Messages whose TTL passes meanwhile expire when it restarts.
func (n *NATS) Stop(t testing.TB) {
	t.Helper()
	n.Server.Shutdown()
	n.Server.WaitForShutdown()
}

// Restart starts the server again with the same options on the same port
// and store directory: a nats-server restarted on its store.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	opts := n.opts.Clone()
	opts.Port = n.port
	var err error
	for range 50 { // the old listener's port may take a moment to free
		var ns *server.Server
		if ns, err = embednats.Start(opts, 10*time.Second); err == nil {
			n.Server = ns // stopped by StartNATS's cleanup
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("testkit: restart nats-server on %s: %v", n.URL, err)
}

// StopJetStream turns JetStream off on the running server, which keeps
// its client connections: a JetStream outage (a lost meta leader, a full
// store) that a client's connection state does not show. Every stream
// and KV call fails until StartJetStream.
func (n *NATS) StopJetStream(t testing.TB) {
	t.Helper()
	if err := n.Server.DisableJetStream(); err != nil {
		t.Fatalf("testkit: disable JetStream: %v", err)
	}
}

// StartJetStream turns JetStream on again on the same store directory:
// the streams and buckets come back with what they held.
func (n *NATS) StartJetStream(t testing.TB) {
	t.Helper()
	if err := n.Server.EnableJetStream(&server.JetStreamConfig{StoreDir: n.opts.StoreDir}); err != nil {
		t.Fatalf("testkit: enable JetStream: %v", err)
	}
}
