package app

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/app/agenttest"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The contract suites' interfaces are the app's own.
var (
	_ agenttest.Publisher   = publisher(nil)
	_ publisher             = agenttest.Publisher(nil)
	_ agenttest.Heartbeat   = heartbeat(nil)
	_ heartbeat             = agenttest.Heartbeat(nil)
	_ agenttest.NodeRecords = nodeRecords(nil)
	_ nodeRecords           = agenttest.NodeRecords(nil)
	_ nodeRecords           = (*capacity.Store)(nil)
)

func pw(user string) string { return "pw-" + user }

// provisioned is a real NATS with the topology's users, streams and
// heartbeat bucket, an admin connection and one as the node agent.
func provisioned(t *testing.T) (admin, agentConn *bus.Conn) {
	t.Helper()
	n := testkit.StartNATS(t, testkit.WithUsers(topology.Users(), pw))
	conn := func(user string) *bus.Conn {
		c, err := bus.Connect(t.Context(), bus.Config{URL: n.URL, User: user, Password: pw(user)}, bus.Instruments{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.WithoutCancel(t.Context())) })
		return c
	}
	admin = conn(topology.Admin)
	if err := admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.EnsureHeartbeats(t.Context(), topology.Heartbeats(1, time.Second)); err != nil {
		t.Fatal(err)
	}
	return admin, conn(topology.NodeAgent)
}

func TestTheJetStreamPublisherPassesThePublisherContract(t *testing.T) {
	t.Parallel()
	admin, conn := provisioned(t)
	agenttest.RunPublisherContract(t, func(t *testing.T) agenttest.PublisherUnderTest {
		return agenttest.PublisherUnderTest{Publisher: busPublisher{conn: conn}, Held: func(t *testing.T, subject string) [][]byte {
			return heldOn(t, admin, topology.StreamNodes, subject)
		}}
	})
}

// heldOn reads every message on subject of stream, oldest first.
func heldOn(t *testing.T, admin *bus.Conn, stream, subject string) [][]byte {
	t.Helper()
	oc, err := admin.JetStream().OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		batch, err := oc.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			out = append(out, m.Data())
		}
		if n == 0 {
			return out
		}
	}
}

func TestTheJetStreamHeartbeatPassesTheHeartbeatContract(t *testing.T) {
	t.Parallel()
	_, conn := provisioned(t)
	hb, err := conn.OpenHeartbeats(t.Context(), topology.HeartbeatBucket, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	agenttest.RunHeartbeatContract(t, func(t *testing.T) agenttest.HeartbeatUnderTest {
		return agenttest.HeartbeatUnderTest{Heartbeat: busHeartbeat{hb: hb}, Alive: func(t *testing.T, node string) (bool, int64) {
			alive, payload, err := hb.Alive(t.Context(), node)
			if err != nil {
				t.Fatal(err)
			}
			if !alive {
				return false, 0
			}
			epoch, err := strconv.ParseInt(string(payload), 10, 64)
			if err != nil {
				t.Fatalf("payload %q is not an epoch: %v", payload, err)
			}
			return true, epoch
		}}
	})
}

// reporting is an agent of node n1 at epoch 3 with only what reporting
// needs: fakes of the bus and the heartbeat bucket.
func reporting(t *testing.T) (*nodeAgent, *agenttest.Bus, *agenttest.Beats) {
	a, b, h, _ := withFakes(t)
	a.epoch = 3
	return a, b, h
}

// withFakes is an agent of node n1 (one GPU, not registered yet) over
// fakes of the bus, the heartbeat bucket and the capacity store, without
// GPUs, runtime or loops.
func withFakes(t *testing.T) (*nodeAgent, *agenttest.Bus, *agenttest.Beats, *agenttest.Capacity) {
	t.Helper()
	b, h, c := agenttest.NewBus(), agenttest.NewBeats(), agenttest.NewCapacity()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	inv := gpu.Inventory{Devices: []gpu.Device{{Index: 0, UUID: "GPU-0", Model: "H100-SXM5-80GB", VRAMMiB: 81920, PCIBusID: "0000:18:00.0"}}}
	desc, err := agent.Describe(agent.Facts{NodeID: "n1", Zone: "local", Market: shizuv1.Market_MARKET_ON_DEMAND,
		PriceMicros: 2_000_000, Currency: "USD", CPUMilli: 8000, MemoryMiB: 65536}, inv)
	if err != nil {
		t.Fatal(err)
	}
	a := &nodeAgent{cfg: Config{NodeID: "n1", HeartbeatInterval: time.Hour}, log: slog.New(slog.NewTextHandler(t.Output(), nil)),
		bus: b, beats: h, store: c, now: func() time.Time { return at }, report: agent.Events{NodeID: "n1", Source: "node-agent/n1"},
		desc: desc, inv: inv, health: agent.NewHealthBook(1), running: map[string]agent.Rental{}, stopping: map[string]shizuv1.ExitReason{},
		beatNow: make(chan struct{}, 1)}
	return a, b, h, c
}

func TestAHealthChangeTheBusRefusesIsRetriedAndTheChangesStayInOrder(t *testing.T) {
	t.Parallel()
	a, b, _ := reporting(t)
	refused := 0
	b.Refuse(func(string, proto.Message) error {
		if refused < 2 {
			refused++
			return errors.New("no responders")
		}
		return nil
	})
	a.publishHealth(t.Context(), []agent.HealthChange{
		{Index: 2, Previous: shizuv1.Health_HEALTH_HEALTHY, Now: shizuv1.Health_HEALTH_FAILED, XID: 79, Reason: "fell off the bus"},
		{Index: -1, Previous: shizuv1.Health_HEALTH_HEALTHY, Now: shizuv1.Health_HEALTH_DEGRADED, Reason: "GPU 2 failed"},
	})
	calls := b.Calls()
	if len(calls) != 4 || calls[0].Err == nil || calls[1].Err == nil || calls[2].Err != nil || calls[3].Err != nil {
		t.Fatalf("calls = %v, want two refusals then both changes", calls)
	}
	held := b.Held("node.n1.health")
	if len(held) != 2 {
		t.Fatalf("held %d health changes, want 2", len(held))
	}
	var first, second shizuv1.NodeHealthChanged
	if err := proto.Unmarshal(held[0], &first); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(held[1], &second); err != nil {
		t.Fatal(err)
	}
	if first.GetGpuIndex() != 2 || first.GetEpoch() != 3 || first.GetXid() != 79 || second.GetGpuIndex() != -1 ||
		first.GetMeta().GetEventId() != "node:n1:health:3:2:HEALTH_FAILED" {
		t.Fatalf("held %v then %v", &first, &second)
	}
}

func TestTheHeartbeatCarriesTheEpochBeatsAtOnceWhenAskedAndOutlivesARefusal(t *testing.T) {
	t.Parallel()
	a, _, h := reporting(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.beatLoop(ctx) // every hour: only an out-of-turn beat comes within the test
	}()
	defer func() {
		cancel()
		<-done
	}()
	a.beatNow <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() error {
		if alive, epoch := h.Alive("n1"); !alive || epoch != 3 {
			return errors.New("no beat at epoch 3 yet")
		}
		return nil
	})
	h.Refuse(func(string) error { return errors.New("bucket gone") })
	a.beatNow <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() error {
		if calls := h.Calls(); len(calls) < 2 || calls[1].Err == nil {
			return errors.New("no refused beat yet")
		}
		return nil
	})
	h.Refuse(nil)
	a.mu.Lock()
	a.epoch = 4 // registered again
	a.mu.Unlock()
	a.beatNow <- struct{}{}
	testkit.Eventually(t, 10*time.Second, func() error {
		if alive, epoch := h.Alive("n1"); !alive || epoch != 4 {
			return errors.New("no beat at epoch 4 after the refusal")
		}
		return nil
	})
}

func TestTheRedisCapacityStorePassesTheNodeRecordsContract(t *testing.T) {
	t.Parallel()
	store, err := capacity.New(testkit.StartRedis(t).Client(t))
	if err != nil {
		t.Fatal(err)
	}
	agenttest.RunNodeRecordsContract(t, func(t *testing.T) agenttest.NodeRecordsUnderTest {
		return agenttest.NodeRecordsUnderTest{Records: store,
			Reserve: func(t *testing.T, rental, node string, epoch uint64) {
				if _, err := store.Reserve(t.Context(), capacity.Placement{RentalID: rental, NodeID: node, Epoch: epoch, Tenant: "acme",
					GPUs: []capacity.GPUShare{{Index: 0, Milli: 1000}}}); err != nil {
					t.Fatal(err)
				}
			},
			Fence: func(t *testing.T, node string, epoch uint64) {
				if _, err := store.Fence(t.Context(), node, epoch); err != nil {
					t.Fatal(err)
				}
			}}
	})
}
