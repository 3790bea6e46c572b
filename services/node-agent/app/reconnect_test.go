package app_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/services/node-agent/app"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Failover reads an agent's disconnect as a suspected crash and gives it a
// grace much shorter than a heartbeat interval to show it is alive, so an
// agent whose connection comes back beats at once instead of at its next
// interval (here a minute away).
func TestAnAgentBeatsAtOnceWhenItsConnectionComesBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config(t, "n1", "h100x8", t.TempDir())
	cfg.HeartbeatInterval, cfg.HeartbeatTTL = time.Minute, 2*time.Minute
	e.start(t, cfg)
	kv, err := e.admin.JetStream().KeyValue(t.Context(), topology.HeartbeatBucket)
	if err != nil {
		t.Fatal(err)
	}
	var first uint64
	testkit.Eventually(t, 10*time.Second, func() error {
		en, err := kv.Get(t.Context(), "node.n1")
		if err != nil {
			return err
		}
		first = en.Revision()
		return nil
	})
	conns, err := e.nats.Server.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kicked := false
	for _, c := range conns.Conns {
		if c.Name == app.ClientName("n1") {
			if err := e.nats.Server.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			kicked = true
		}
	}
	if !kicked {
		t.Fatalf("no connection named %s", app.ClientName("n1"))
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		en, err := kv.Get(t.Context(), "node.n1")
		if err != nil {
			return err
		}
		if en.Revision() == first {
			return fmt.Errorf("no beat since the reconnect (revision %d)", first)
		}
		return nil
	})
}
