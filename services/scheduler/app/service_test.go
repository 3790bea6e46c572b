package app_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Two replicas race 2,000 requests (fractions, whole GPUs, NVLink pairs,
// and some invalid specs) for a fleet that holds about two thirds of them.
// Every request ends scheduled, pending or rejected exactly once, nothing
// is booked twice, and what the store holds is exactly what was scheduled.
func TestTwoReplicasRacing2000RequestsNeverDoubleBook(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 120 {
		e.register(gpuNode(fmt.Sprintf("node-%02d", i), 8, capacity.MarketOnDemand))
	}
	cfg := testConfig()
	cfg.BatchSize, cfg.Concurrency = 128, 256
	e.replica(cfg, time.Now)
	e.replica(cfg, time.Now)

	const total = 2000
	now := time.Now()
	var evs []*shizuv1.RentalRequested
	invalid := 0
	for i := range total {
		var sp *shizuv1.RentalSpec
		switch i % 10 {
		case 0, 1, 2, 3:
			sp = spec(1, 250, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND)
		case 4, 5:
			sp = spec(1, 500, 20*1024, shizuv1.Plan_PLAN_ON_DEMAND)
		case 6, 7, 8:
			sp = spec(1, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
		case 9:
			sp = spec(2, 1000, 0, shizuv1.Plan_PLAN_ON_DEMAND)
		}
		if i%97 == 0 {
			sp.MilliGpu = 1500 // invalid: rejected at once
			invalid++
		}
		evs = append(evs, requested(fmt.Sprintf("r%04d", i), fmt.Sprintf("tenant-%d", i%7), sp, now))
	}
	for start := 0; start < total; start += 250 {
		var msgs []proto.Message
		for _, ev := range evs[start : start+250] {
			msgs = append(msgs, ev)
		}
		e.publish(msgs...)
	}
	testkitWait(t, e, total)

	o := e.seen
	o.mu.Lock()
	defer o.mu.Unlock()
	var scheduled, pending, rejected int
	for i := range total {
		id := fmt.Sprintf("r%04d", i)
		s, p, r := len(o.scheduled[id]), len(o.pending[id]), len(o.rejected[id])
		switch {
		case s == 1 && p == 0 && r == 0:
			scheduled++
			if o.starts[id] != 1 {
				t.Errorf("%s: %d start commands, want 1", id, o.starts[id])
			}
		case s == 0 && p == 1 && r == 0:
			pending++
		case s == 0 && p == 0 && r == 1:
			rejected++
			if o.rejected[id][0].GetReason() != shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC {
				t.Errorf("%s rejected for %v", id, o.rejected[id][0].GetReason())
			}
		default:
			t.Errorf("%s: %d scheduled, %d pending, %d rejected events; want exactly one", id, s, p, r)
		}
	}
	t.Logf("%d scheduled, %d pending, %d rejected", scheduled, pending, rejected)
	if rejected != invalid || scheduled == 0 || pending == 0 {
		t.Fatalf("want %d rejected, some scheduled and some pending; got %d/%d/%d", invalid, scheduled, pending, rejected)
	}

	// The store holds exactly the scheduled rentals, where they were
	// announced, and no GPU is over-committed.
	snap, err := e.store.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, n := range snap.Nodes {
		for _, g := range n.FreeGPUs {
			if g.Milli < 0 || g.VRAMMiB < 0 || g.Sharers > g.MaxSharers {
				t.Errorf("node %s GPU %d over-committed: %+v", n.ID, g.Index, g)
			}
		}
		for _, a := range n.Allocations {
			if prev, dup := held[a.RentalID]; dup {
				t.Errorf("%s booked on %s and %s", a.RentalID, prev, n.ID)
			}
			held[a.RentalID] = n.ID
		}
	}
	if len(held) != scheduled {
		t.Errorf("store holds %d rentals, %d were scheduled", len(held), scheduled)
	}
	for id, evs := range o.scheduled {
		if held[id] != evs[0].GetNodeId() {
			t.Errorf("%s scheduled on %s, store has it on %q", id, evs[0].GetNodeId(), held[id])
		}
	}
}

func testkitWait(t *testing.T, e *env, total int) {
	t.Helper()
	e.seen.waitFor(t, 60*time.Second, func(o *outcomes) error {
		n := 0
		ids := map[string]bool{}
		for id := range o.scheduled {
			ids[id] = true
		}
		for id := range o.pending {
			ids[id] = true
		}
		for id := range o.rejected {
			ids[id] = true
		}
		n = len(ids)
		if n < total {
			return fmt.Errorf("%d of %d requests decided", n, total)
		}
		return nil
	})
}
