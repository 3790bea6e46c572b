package app

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// spotFull makes the rig's n1 hold two spot rentals, one GPU each; "young"
// has run less, so it is the cheaper victim.
func (r *rig) spotFull(t *testing.T) {
	t.Helper()
	n, _ := r.s.view.Node("n1")
	for i, v := range []struct {
		id    string
		since time.Time
	}{{"old", roundNow.Add(-time.Hour)}, {"young", roundNow.Add(-time.Minute)}} {
		n.GPUs[i].FreeMilli, n.GPUs[i].FreeVRAMMiB, n.GPUs[i].Sharers = 0, 0, 1
		n.Allocations = append(n.Allocations, placement.Allocation{RentalID: v.id, Tenant: "spotty", Class: rent.ClassSpot,
			CPUMilli: 1000, MemoryMiB: 1024, GPUs: []placement.Share{{Index: i, Milli: 1000, VRAMMiB: 80 * 1024}}, Since: v.since})
		if res := r.res.ReserveMany(t.Context(), []capacity.Placement{{RentalID: v.id, NodeID: "n1", Epoch: 1, Tenant: "spotty",
			CPUMilli: 1000, MemoryMiB: 1024, GPUs: []capacity.GPUShare{{Index: i, Milli: 1000}}}}); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	r.s.view.SetNode(*n)
}

// A view older than the store still shows a spot rental that stopped
// (its preemption record dropped with it, as stopVictims does): a plan
// that picks it claims it, finds it gone and gives the claim up. Nothing
// is announced for a rental that no longer runs, and no record is left
// that would make the request wait for it.
func TestAVictimThatStoppedIsNotPreemptedAgainFromAStaleView(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.spotFull(t)
	for _, id := range []string{"old", "young"} {
		if _, err := r.res.Release(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if errs := r.decide(t, r.job("od1", 1, roundNow)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if pre := porttest.Events[*shizuv1.RentalPreempted](r.pub); len(pre) != 0 {
		t.Fatalf("preempted %d rentals that had stopped", len(pre))
	}
	if ps, err := r.rec.Preemptions(t.Context()); err != nil || len(ps) != 0 {
		t.Fatalf("preemption records %+v, %v; want none", ps, err)
	}
	entries, _, err := r.rec.Pending(t.Context())
	if err != nil || len(entries) != 1 || entries[0].Reason != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY {
		t.Fatalf("pending %+v, %v; want od1 waiting for capacity", entries, err)
	}
}

// A burst of on-demand requests against two spot victims: each victim is
// claimed and announced for one request only; a request whose victim was
// taken first waits for capacity and plans again, taking the next victim;
// once no victim is left, nothing more is announced.
func TestEachSpotVictimIsPreemptedForOneRequestOnly(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.spotFull(t)
	od := []*job{r.job("od1", 1, roundNow.Add(-3*time.Second)), r.job("od2", 1, roundNow.Add(-2*time.Second)), r.job("od3", 1, roundNow.Add(-time.Second))}
	if errs := r.decide(t, od...); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("outcomes %v", errs)
	}
	// From the pending set, as the retries run them.
	for round := range 3 {
		entries, _, err := r.rec.Pending(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var again []*job
		for _, e := range entries {
			j := r.s.newJob(e.Event, requestOf(e.Event), 1)
			j.FromPending, j.PreemptUntil, j.Reason = true, e.PreemptUntil, e.Reason
			again = append(again, j)
		}
		for _, err := range r.decide(t, again...) {
			if err != nil {
				t.Fatalf("retry %d: %v", round, err)
			}
		}
	}
	pre := porttest.Events[*shizuv1.RentalPreempted](r.pub)
	by := map[string][]string{}
	for _, p := range pre {
		by[p.GetRentalId()] = append(by[p.GetRentalId()], p.GetPreemptingRentalId())
	}
	if len(pre) != 2 || len(by["young"]) != 1 || len(by["old"]) != 1 || by["young"][0] == by["old"][0] {
		t.Fatalf("preempted %v; want young and old once each, for two different requests", by)
	}
	if by["young"][0] != "od1" {
		t.Fatalf("the cheapest victim went to %s, want the oldest request od1", by["young"][0])
	}
	ps, err := r.rec.Preemptions(t.Context())
	if err != nil || len(ps) != 2 {
		t.Fatalf("preemption records %+v, %v", ps, err)
	}
}

// A request rejected when its wait ran out frees whatever the store holds
// under its rental id (a reservation whose replica died before recording
// it).
func TestAPendingTimeoutFreesAReservationHeldUnderTheRentalID(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	if res := r.res.ReserveMany(t.Context(), []capacity.Placement{{RentalID: "late", NodeID: "n1", Epoch: 1, Tenant: "tenant-a",
		CPUMilli: 4000, MemoryMiB: 16 * 1024, GPUs: []capacity.GPUShare{{Index: 0, Milli: 1000}}}}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if errs := r.decide(t, r.job("late", 3, roundNow.Add(-11*time.Minute))); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if rej := porttest.Events[*shizuv1.RentalRejected](r.pub); len(rej) != 1 || rej[0].GetReason() != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT {
		t.Fatalf("rejected %v", rej)
	}
	if _, err := r.res.Allocation(t.Context(), "late"); !capacity.IsNotFound(err) {
		t.Fatalf("the rejected rental still holds its reservation: %v", err)
	}
}
