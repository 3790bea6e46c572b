// Package agenttest holds the contract suites of the interfaces the node
// agent needs of the bus (app/ports.go declares the same methods) and
// hand-written recording fakes that pass them. The real adapters run the
// suites against a real NATS (shared/testkit); so do the fakes, so a test
// that uses a fake tests what the real adapter does.
package agenttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// The interfaces the node agent needs (its own declarations in app have
// the same methods).
type (
	// Publisher publishes one event to a subject and returns once the
	// stream holds it; a repeated event id is held once.
	Publisher interface {
		Publish(ctx context.Context, subject string, ev proto.Message) error
	}
	// Heartbeat renews a node's liveness key with its epoch.
	Heartbeat interface {
		Beat(ctx context.Context, node string, epoch int64) error
	}
	// NodeRecords are the capacity store's records of one node: its
	// registration, epoch and status, and the allocations it holds.
	NodeRecords interface {
		Join(ctx context.Context, n capacity.Node) (capacity.Registration, error)
		Restore(ctx context.Context, in capacity.RestoreInput) (capacity.RestoreResult, error)
		Generation(ctx context.Context) (string, error)
		Node(ctx context.Context, nodeID string) (capacity.NodeState, error)
		Renew(ctx context.Context, rentalID, nodeID string, epoch uint64) error
		SetStatus(ctx context.Context, nodeID string, status capacity.NodeStatus, expectedEpoch uint64) error
		Allocations(ctx context.Context, nodeID string) ([]capacity.Allocation, error)
	}
)

// PublisherUnderTest is a Publisher with a way to read back what it holds.
type PublisherUnderTest struct {
	Publisher Publisher
	// Held returns the encoded events held on subject, oldest first.
	Held func(t *testing.T, subject string) [][]byte
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// drained is a valid NodeDrained of node at epoch; its id names both.
func drained(node string, epoch int64) *shizuv1.NodeDrained {
	return &shizuv1.NodeDrained{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("node:%s:drained:%d", node, epoch), "node-agent/"+node, "", node, t0),
		NodeId: node, Epoch: epoch, DrainStartedAt: timestamppb.New(t0), Reason: "scale-in",
	}
}

// RunPublisherContract checks what the agent relies on when it publishes:
// an event is held on its subject as sent, a repeat of an event id is held
// once (a redelivered start re-announces its RentalStarted), and what
// cannot be an event (no id, invalid UTF-8) or comes after its context
// ended is refused and not held.
func RunPublisherContract(t *testing.T, open func(t *testing.T) PublisherUnderTest) {
	held := func(t *testing.T, p PublisherUnderTest, subject string) []*shizuv1.NodeDrained {
		t.Helper()
		var out []*shizuv1.NodeDrained
		for _, b := range p.Held(t, subject) {
			ev := &shizuv1.NodeDrained{}
			if err := proto.Unmarshal(b, ev); err != nil {
				t.Fatalf("held event on %s does not decode: %v", subject, err)
			}
			out = append(out, ev)
		}
		return out
	}
	t.Run("a published event is held on its subject as sent", func(t *testing.T) {
		p := open(t)
		ev := drained("c-held", 1)
		if err := p.Publisher.Publish(t.Context(), "node.c-held.drained", ev); err != nil {
			t.Fatal(err)
		}
		got := held(t, p, "node.c-held.drained")
		if len(got) != 1 || !proto.Equal(got[0], ev) {
			t.Fatalf("held %v, want [%v]", got, ev)
		}
		if other := held(t, p, "node.c-other.drained"); len(other) != 0 {
			t.Fatalf("another subject holds %v", other)
		}
	})
	t.Run("an event published twice under one id is held once", func(t *testing.T) {
		p := open(t)
		for range 2 {
			if err := p.Publisher.Publish(t.Context(), "node.c-dup.drained", drained("c-dup", 1)); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Publisher.Publish(t.Context(), "node.c-dup.drained", drained("c-dup", 2)); err != nil {
			t.Fatal(err)
		}
		if got := held(t, p, "node.c-dup.drained"); len(got) != 2 || got[0].GetEpoch() != 1 || got[1].GetEpoch() != 2 {
			t.Fatalf("held %v, want epochs 1 and 2 once each", got)
		}
	})
	t.Run("what cannot be an event is refused and not held", func(t *testing.T) {
		p := open(t)
		noID := drained("c-bad", 1)
		noID.Meta.EventId = ""
		badText := drained("c-bad", 2)
		badText.Reason = "scale-in \xe2\x96" // a █ cut in half
		for _, ev := range []*shizuv1.NodeDrained{noID, badText} {
			if err := p.Publisher.Publish(t.Context(), "node.c-bad.drained", ev); err == nil {
				t.Errorf("published %v", ev)
			}
		}
		if got := held(t, p, "node.c-bad.drained"); len(got) != 0 {
			t.Fatalf("held %v", got)
		}
	})
	t.Run("a publish after its context ended fails and is not held", func(t *testing.T) {
		p := open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := p.Publisher.Publish(ctx, "node.c-late.drained", drained("c-late", 1)); err == nil {
			t.Fatal("published with an ended context")
		}
		if got := held(t, p, "node.c-late.drained"); len(got) != 0 {
			t.Fatalf("held %v", got)
		}
	})
}

// HeartbeatUnderTest is a Heartbeat with a way to read a node's key.
type HeartbeatUnderTest struct {
	Heartbeat Heartbeat
	// Alive reads node's key: whether it is held, and the epoch it carries.
	Alive func(t *testing.T, node string) (alive bool, epoch int64)
}

// RunHeartbeatContract checks what failover relies on when it reads the
// agent's beats: a beat makes the node alive with the epoch it beat at, a
// later beat carries the later epoch, nodes are kept apart, and a node id
// that is not a subject token or a beat after its context ended is
// refused. (Expiry by TTL is the bucket's, checked by shared/bus.)
func RunHeartbeatContract(t *testing.T, open func(t *testing.T) HeartbeatUnderTest) {
	t.Run("a beat makes the node alive with its epoch and a later beat carries the later one", func(t *testing.T) {
		h := open(t)
		if alive, _ := h.Alive(t, "hb-1"); alive {
			t.Fatal("a node that never beat is alive")
		}
		for _, epoch := range []int64{3, 4} {
			if err := h.Heartbeat.Beat(t.Context(), "hb-1", epoch); err != nil {
				t.Fatal(err)
			}
			if alive, got := h.Alive(t, "hb-1"); !alive || got != epoch {
				t.Fatalf("alive %v at epoch %d, want alive at %d", alive, got, epoch)
			}
		}
		if alive, _ := h.Alive(t, "hb-2"); alive {
			t.Fatal("another node is alive by hb-1's beat")
		}
	})
	t.Run("a node id that is not a subject token is refused", func(t *testing.T) {
		h := open(t)
		if err := h.Heartbeat.Beat(t.Context(), "hb 3", 1); err == nil {
			t.Fatal("beat for a node id with a space")
		}
	})
	t.Run("a beat after its context ended fails and keeps nobody alive", func(t *testing.T) {
		h := open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := h.Heartbeat.Beat(ctx, "hb-4", 1); err == nil {
			t.Fatal("beat with an ended context")
		}
		if alive, _ := h.Alive(t, "hb-4"); alive {
			t.Fatal("a refused beat made the node alive")
		}
	})
}

// NodeRecordsUnderTest is NodeRecords with what the scheduler and
// failover do to them, which the agent only observes.
type NodeRecordsUnderTest struct {
	Records NodeRecords
	// Reserve allocates all of GPU 0 of node to rental under epoch.
	Reserve func(t *testing.T, rental, node string, epoch uint64)
	// Fence takes node out of service at epoch (its epoch moves on by one).
	Fence func(t *testing.T, node string, epoch uint64)
}

// validNode is a valid node of id with one whole GPU.
func validNode(id string) capacity.Node {
	return capacity.Node{ID: id, Zone: "local", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_000_000, Currency: "USD",
		CPUMilli: 8000, MemoryMiB: 65536, GPUs: []capacity.GPU{{Index: 0, UUID: "GPU-" + id, Model: "H100-SXM5-80GB", VRAMMiB: 81920}}}
}

// RunNodeRecordsContract checks what the agent relies on in the capacity
// store: a restart keeps the epoch and the allocations, a fence kills the
// node at the next epoch and its allocations can never be renewed again,
// registering brings a fenced node back, a drain outlives a registration,
// and what is not there is not found.
func RunNodeRecordsContract(t *testing.T, open func(t *testing.T) NodeRecordsUnderTest) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, u NodeRecordsUnderTest)
	}{
		{"a new node is ready at epoch 1 and a registration again keeps its epoch and allocations", recordsRestart},
		{"what is not there is not found", recordsNotFound},
		{"a fenced node's allocations are never renewed and registering brings the node back", recordsFence},
		{"a drain outlives a registration and is refused at a stale epoch", recordsDrain},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, open(t)) })
	}
}

func registerNode(t *testing.T, r NodeRecords, id string, want uint64) {
	t.Helper()
	if reg, err := r.Join(t.Context(), validNode(id)); err != nil || reg.Epoch != want || reg.Generation == "" {
		t.Fatalf("register %s = %+v, %v; want epoch %d and the store's generation", id, reg, err, want)
	}
}

func nodeIs(t *testing.T, r NodeRecords, id string, status capacity.NodeStatus, epoch uint64) {
	t.Helper()
	st, err := r.Node(t.Context(), id)
	if err != nil || st.Status != status || st.Epoch != epoch {
		t.Fatalf("node %s = %s at epoch %d (%v), want %s at %d", id, st.Status, st.Epoch, err, status, epoch)
	}
}

func recordsRestart(t *testing.T, u NodeRecordsUnderTest) {
	registerNode(t, u.Records, "nr-1", 1)
	nodeIs(t, u.Records, "nr-1", capacity.StatusReady, 1)
	u.Reserve(t, "r-1", "nr-1", 1)
	registerNode(t, u.Records, "nr-1", 1)
	if err := u.Records.Renew(t.Context(), "r-1", "nr-1", 1); err != nil {
		t.Fatalf("renew after a clean restart: %v", err)
	}
	allocs, err := u.Records.Allocations(t.Context(), "nr-1")
	if err != nil || len(allocs) != 1 || allocs[0].RentalID != "r-1" || allocs[0].Epoch != 1 {
		t.Fatalf("allocations = %+v, %v", allocs, err)
	}
}

func recordsNotFound(t *testing.T, u NodeRecordsUnderTest) {
	if _, err := u.Records.Node(t.Context(), "nr-none"); !capacity.IsNotFound(err) {
		t.Fatalf("node of no such node: %v", err)
	}
	if err := u.Records.Renew(t.Context(), "r-1", "nr-none", 1); !capacity.IsNotFound(err) {
		t.Fatalf("renew on no such node: %v", err)
	}
	registerNode(t, u.Records, "nr-2", 1)
	if err := u.Records.Renew(t.Context(), "r-none", "nr-2", 1); !capacity.IsNotFound(err) {
		t.Fatalf("renew of no such allocation: %v", err)
	}
	if allocs, err := u.Records.Allocations(t.Context(), "nr-2"); err != nil || len(allocs) != 0 {
		t.Fatalf("allocations of an empty node = %+v, %v", allocs, err)
	}
}

func recordsFence(t *testing.T, u NodeRecordsUnderTest) {
	registerNode(t, u.Records, "nr-3", 1)
	u.Reserve(t, "r-3", "nr-3", 1)
	u.Fence(t, "nr-3", 1)
	nodeIs(t, u.Records, "nr-3", capacity.StatusDead, 2)
	if err := u.Records.Renew(t.Context(), "r-3", "nr-3", 1); !capacity.IsFenced(err) {
		t.Fatalf("renew on a dead node: %v", err)
	}
	if err := u.Records.SetStatus(t.Context(), "nr-3", capacity.StatusDraining, 2); !capacity.IsFenced(err) {
		t.Fatalf("drain of a dead node: %v", err)
	}
	registerNode(t, u.Records, "nr-3", 2)
	nodeIs(t, u.Records, "nr-3", capacity.StatusReady, 2)
	for _, epoch := range []uint64{1, 2} {
		if err := u.Records.Renew(t.Context(), "r-3", "nr-3", epoch); !capacity.IsFenced(err) {
			t.Fatalf("renew of an allocation from before the fence at epoch %d: %v", epoch, err)
		}
	}
	if allocs, err := u.Records.Allocations(t.Context(), "nr-3"); err != nil || len(allocs) != 1 || allocs[0].RentalID != "r-3" {
		t.Fatalf("a fenced allocation stays recorded until released: %+v, %v", allocs, err)
	}
}

func recordsDrain(t *testing.T, u NodeRecordsUnderTest) {
	registerNode(t, u.Records, "nr-4", 1)
	for range 2 { // setting the status a node has changes nothing
		if err := u.Records.SetStatus(t.Context(), "nr-4", capacity.StatusDraining, 1); err != nil {
			t.Fatal(err)
		}
	}
	registerNode(t, u.Records, "nr-4", 1)
	nodeIs(t, u.Records, "nr-4", capacity.StatusDraining, 1)
	if err := u.Records.SetStatus(t.Context(), "nr-4", capacity.StatusReady, 7); !capacity.IsConflict(err) {
		t.Fatalf("status at a stale epoch: %v", err)
	}
	nodeIs(t, u.Records, "nr-4", capacity.StatusDraining, 1)
}
