package app_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Failover reads an agent's disconnect as a suspected crash and gives it a
// grace much shorter than a heartbeat interval to show it is alive, so an
// agent whose connection comes back beats at once instead of at its next
// interval (here a minute away).
func TestAnAgentBeatsAtOnceWhenItsConnectionComesBack(t *testing.T) {
	// The connection name failover reads a node id out of
	// (services/failover/detect.NodeFromClientName).
	const agentClient = "node-agent:n1"
	t.Parallel()
	e := newEnv(t)
	cfg := e.config(t, "n1", "h100x8", t.TempDir())
	cfg.HeartbeatInterval, cfg.HeartbeatTTL = time.Minute, 2*time.Minute
	e.start(t, cfg)
	kv, err := e.Admin.JetStream().KeyValue(t.Context(), topology.HeartbeatBucket)
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
	conns, err := e.NATS.Server.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kicked := false
	for _, c := range conns.Conns {
		if c.Name == agentClient {
			if err := e.NATS.Server.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			kicked = true
		}
	}
	if !kicked {
		t.Fatalf("no connection named %s", agentClient)
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

// A simulated agent started with -simulate-notice-lead turns SIGUSR1 into
// a spot interruption notice (what a test of make-before-break sends to
// a child agent): the node drains and announces the deadline.
func TestSIGUSR1DeliversASimulatedSpotNotice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config(t, "n-usr1", "h100x8", t.TempDir())
	cfg.SimulateNoticeLead = 45 * time.Second
	e.start(t, cfg)
	sent := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	n := await(t, e, topology.StreamNodes, "node.n-usr1.interruption", func(ev *shizuv1.NodeInterruptionNoticed) error { return nil })
	if d := n.GetDeadline().AsTime(); d.Before(sent.Add(45*time.Second)) || d.After(time.Now().Add(45*time.Second)) {
		t.Fatalf("deadline %s, want 45 s after the signal at %s", d, sent)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		st, err := e.store.Node(t.Context(), "n-usr1")
		if err != nil || st.Status != capacity.StatusDraining {
			return fmt.Errorf("node %v (%w), want draining", st.Status, err)
		}
		return nil
	})
}
