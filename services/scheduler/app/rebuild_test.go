package app_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// restoreAsItsAgent puts node back into the (emptied) store with the
// allocations of the rentals scheduled on it, as its node agent does after
// a Redis loss.
func (e *env) restoreAsItsAgent(t *testing.T, node capacity.Node, rentals ...string) {
	t.Helper()
	in := capacity.RestoreInput{Node: node, Epoch: 1}
	for _, id := range rentals {
		sc := e.seen.snapshotScheduled(id)[0]
		p := capacity.Placement{RentalID: id, NodeID: node.ID, Epoch: uint64(sc.GetNodeEpoch()), Tenant: sc.GetTenantId(),
			CPUMilli: sc.GetCpuMilli(), MemoryMiB: sc.GetMemoryMib(), Attempt: sc.GetAttempt()}
		for _, g := range sc.GetGpus() {
			p.GPUs = append(p.GPUs, capacity.GPUShare{Index: int(g.GetGpuIndex()), Milli: int64(g.GetMilliGpu()), VRAMMiB: g.GetVramMib()})
		}
		in.Placements = append(in.Placements, p)
	}
	if _, err := e.store.Restore(t.Context(), in); err != nil {
		t.Fatal(err)
	}
}

// Requests waiting for capacity outlive the loss of Redis (restarted
// empty): two replicas rebuild their records from the rentals stream, so
// once capacity comes every waiting request is placed, exactly once, and
// the rentals placed before the loss are neither placed again nor freed.
// (313 waiting requests: the operator's count in issue 14.)
func TestPendingRequestsArePlacedAfterRedisWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	first := gpuNode("node-a", 8, capacity.MarketOnDemand)
	e.register(first)
	cfg := testConfig()
	cfg.RecordsCheck = 100 * time.Millisecond
	cfg.ReconcileInterval, cfg.ReconcileAge = 100*time.Millisecond, time.Second
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)

	now := time.Now()
	const placed, waiting = 16, 313 // the placed ones fill node-a, two to a GPU
	var ids []string
	var msgs []proto.Message
	for i := range placed + waiting {
		id := fmt.Sprintf("rb%03d", i)
		ids = append(ids, id)
		sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
		if i < placed {
			sp = spec(1, 500, 20*1024, shizuv1.Plan_PLAN_ON_DEMAND)
		}
		msgs = append(msgs, requested(id, "acme", sp, now.Add(time.Duration(i)*time.Millisecond)))
	}
	e.publish(msgs[:placed]...)
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		for _, id := range ids[:placed] {
			if len(o.scheduled[id]) == 0 {
				return fmt.Errorf("%s not scheduled yet", id)
			}
		}
		return nil
	})
	e.publish(msgs[placed:]...)
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		for _, id := range ids[placed:] {
			if len(o.pending[id]) == 0 {
				return fmt.Errorf("%s not pending yet", id)
			}
		}
		return nil
	})

	st, err := e.store.Node(t.Context(), first.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.setSpotPrice(st, 1_500_000, now)
	lostAt := time.Now()
	e.Redis.Restart(t)
	e.restoreAsItsAgent(t, first, ids[:placed]...)
	// The records are rebuilt with the classes of the rentals that run: the
	// reconciler would free allocations without one.
	rdb := e.Redis.Client(t)
	testkit.Eventually(t, 30*time.Second, func() error {
		n, err := rdb.Exists(t.Context(), "shizu:sched:rebuilt").Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("records not rebuilt yet")
		}
		return nil
	})
	for _, id := range ids[:placed] {
		if c, err := rdb.HGet(t.Context(), "shizu:sched:class", id).Result(); err != nil || c == "" {
			t.Fatalf("class of running %s after the rebuild: %q, %v", id, c, err)
		}
	}
	if p, err := rdb.HGet(t.Context(), "shizu:sched:spot", "zone-a|H100-SXM5-80GB").Result(); err != nil || !strings.Contains(p, "1500000") {
		t.Fatalf("spot price after the rebuild: %q, %v; want the MARKET stream's 1.50", p, err)
	}
	t.Logf("records rebuilt %s after the loss", time.Since(lostAt).Round(time.Millisecond))
	for i := range 40 {
		e.register(gpuNode(fmt.Sprintf("node-b%02d", i), 8, capacity.MarketOnDemand))
	}

	e.seen.waitFor(t, 60*time.Second, func(o *outcomes) error {
		for _, id := range ids[placed:] {
			if len(o.scheduled[id]) == 0 {
				return fmt.Errorf("%s not placed after the loss", id)
			}
		}
		return nil
	})
	t.Logf("%d waiting requests placed %s after the loss", waiting, time.Since(lostAt).Round(time.Millisecond))
	snap, err := e.store.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, n := range snap.Nodes {
		for _, a := range n.Allocations {
			held[a.RentalID] = n.ID
		}
	}
	o := e.seen
	o.mu.Lock()
	defer o.mu.Unlock()
	orphans, twice := 0, 0
	for i, id := range ids {
		n := len(o.scheduled[id])
		switch {
		case n == 0:
			orphans++
		case n > 1:
			twice++
		}
		if i < placed && (n != 1 || held[id] != "node-a") {
			t.Errorf("%s: %d scheduled events (on %v), store has it on %q; want once, on node-a", id, n, nodesOf(o.scheduled[id]), held[id])
		}
		if i >= placed && (n != 1 || held[id] == "" || held[id] == "node-a" || held[id] != o.scheduled[id][0].GetNodeId()) {
			t.Errorf("%s: %d scheduled events (on %v), store has it on %q; want once, on a new node", id, n, nodesOf(o.scheduled[id]), held[id])
		}
		if len(o.rejected[id]) != 0 {
			t.Errorf("%s rejected: %v", id, o.rejected[id])
		}
	}
	t.Logf("after the loss: %d orphaned requests, %d placed twice", orphans, twice)
}

func nodesOf(evs []*shizuv1.RentalScheduled) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.GetNodeId())
	}
	return out
}

// A rental placed before Redis was lost is still known placed after it:
// the first delivery after the loss waits for the records to be rebuilt,
// so a cancel stops the running rental instead of claiming, on empty
// records, that it was never placed.
func TestACancelAfterRedisWasLostStopsThePlacedRental(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	node := gpuNode("node-c", 1, capacity.MarketOnDemand)
	e.register(node)
	cfg := testConfig()
	cfg.RecordsCheck = time.Hour // only the delivery's own check can see the loss
	e.replica(cfg, time.Now)
	e.publish(requested("rc", "acme", spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if len(o.scheduled["rc"]) == 0 {
			return fmt.Errorf("rc not scheduled yet")
		}
		return nil
	})

	e.Redis.Restart(t)
	e.restoreAsItsAgent(t, node, "rc")
	e.publish(&shizuv1.RentalCancelRequested{Meta: shizuv1.NewMeta("cancel:rc", "test", "", "rc", time.Now()),
		RentalId: "rc", TenantId: "acme", RequestedBy: "acme", Reason: "done"})

	e.seen.waitFor(t, 30*time.Second, func(o *outcomes) error {
		if o.stops["rc"] == 0 {
			return fmt.Errorf("no stop sent for rc (rejected: %v)", o.rejected["rc"])
		}
		return nil
	})
	o := e.seen
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.rejected["rc"]) != 0 {
		t.Fatalf("the running rental was reported cancelled before it was placed: %v", o.rejected["rc"])
	}
}
