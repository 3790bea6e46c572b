package porttest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// ReserverFixture is a Reserver under test and the node it holds: ready,
// at Epoch, with at least one GPU (index 0) wholly free and at least 1000
// milli-CPU and 1 GiB of memory free.
type ReserverFixture struct {
	Reserver ports.Reserver
	Node     string
	Epoch    uint64
}

// RunReserverContract checks what the scheduler relies on of a Reserver:
// a reserve records the allocation, a repeat gets it back as Existing with
// the same creation instant (so its AllocToken matches), a stale epoch is
// fenced, a GPU asked beyond its capacity is insufficient, and a release
// gives it back once.
func RunReserverContract(t *testing.T, newImpl func(t *testing.T) ReserverFixture) {
	t.Helper()
	place := func(f ReserverFixture, rental string, milli int64) capacity.Placement {
		return capacity.Placement{RentalID: rental, NodeID: f.Node, Epoch: f.Epoch, Tenant: "tenant-a", CPUMilli: 100, MemoryMiB: 64,
			GPUs: []capacity.GPUShare{{Index: 0, Milli: milli, VRAMMiB: 512}}}
	}
	t.Run("a reserve records the allocation and a repeat gets it back as existing", func(t *testing.T) {
		f := newImpl(t)
		got := f.Reserver.ReserveMany(t.Context(), []capacity.Placement{place(f, "r1", 500), place(f, "r1", 500)})
		if len(got) != 2 || got[0].Err != nil || got[1].Err != nil {
			t.Fatalf("ReserveMany = %+v", got)
		}
		first, again := got[0].Allocation, got[1].Allocation
		if first.Existing || first.RentalID != "r1" || first.NodeID != f.Node || first.CreatedAt.IsZero() {
			t.Fatalf("first reserve = %+v", first)
		}
		if !again.Existing || ports.AllocToken(again) != ports.AllocToken(first) {
			t.Fatalf("repeat = %+v, want the first allocation back as existing", again)
		}
		a, err := f.Reserver.Allocation(t.Context(), "r1")
		if err != nil || ports.AllocToken(a) != ports.AllocToken(first) {
			t.Fatalf("Allocation = %+v, %v", a, err)
		}
	})
	t.Run("a reserve at another epoch is fenced", func(t *testing.T) {
		f := newImpl(t)
		p := place(f, "r1", 500)
		p.Epoch = f.Epoch + 1
		if got := f.Reserver.ReserveMany(t.Context(), []capacity.Placement{p}); !capacity.IsFenced(got[0].Err) {
			t.Fatalf("reserve at epoch %d = %+v, want fenced", p.Epoch, got[0])
		}
	})
	t.Run("a GPU asked beyond what it has free is refused as insufficient", func(t *testing.T) {
		f := newImpl(t)
		got := f.Reserver.ReserveMany(t.Context(), []capacity.Placement{place(f, "r1", 700), place(f, "r2", 700)})
		if got[0].Err != nil || !capacity.IsInsufficient(got[1].Err) {
			t.Fatalf("ReserveMany = %+v, want the second refused as insufficient", got)
		}
	})
	t.Run("a release gives the allocation back once", func(t *testing.T) {
		f := newImpl(t)
		if got := f.Reserver.ReserveMany(t.Context(), []capacity.Placement{place(f, "r1", 1000)}); got[0].Err != nil {
			t.Fatal(got[0].Err)
		}
		if ok, err := f.Reserver.Release(t.Context(), "r1"); !ok || err != nil {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		if ok, err := f.Reserver.Release(t.Context(), "r1"); ok || err != nil {
			t.Fatalf("second Release = %v, %v; want false, nil", ok, err)
		}
		if _, err := f.Reserver.Allocation(t.Context(), "r1"); !capacity.IsNotFound(err) {
			t.Fatalf("Allocation after release: %v, want not found", err)
		}
		if got := f.Reserver.ReserveMany(t.Context(), []capacity.Placement{place(f, "r2", 1000)}); got[0].Err != nil {
			t.Fatalf("the released GPU is not free again: %v", got[0].Err)
		}
	})
}

// RunOutcomeRecordsContract checks what the scheduler relies on of its
// outcome records; newImpl returns empty records.
func RunOutcomeRecordsContract(t *testing.T, newImpl func(t *testing.T) ports.OutcomeRecords) {
	t.Helper()
	t.Run("the first claim of an attempt wins and every later one reads it", func(t *testing.T) {
		rec := newImpl(t)
		won, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeScheduled, []string{"n1@5"}, []ports.Class{{Class: rent.ClassSpot, Priority: 3}})
		if err != nil || len(won) != 1 || won[0] != (round.Claim{Outcome: round.OutcomeScheduled, Won: true, Alloc: "n1@5"}) {
			t.Fatalf("first claim = %+v, %v", won, err)
		}
		lost, err := rec.Claim(t.Context(), []string{"r1", "r2"}, round.OutcomeCancelled, nil, nil)
		if err != nil || lost[0] != (round.Claim{Outcome: round.OutcomeScheduled, Alloc: "n1@5"}) ||
			lost[1] != (round.Claim{Outcome: round.OutcomeCancelled, Won: true}) {
			t.Fatalf("second claim = %+v, %v", lost, err)
		}
		decided, err := rec.Decided(t.Context(), []string{"r1", "r2", "r3"})
		if err != nil || !decided[0] || !decided[1] || decided[2] {
			t.Fatalf("Decided = %v, %v", decided, err)
		}
	})
	t.Run("a placed rental keeps its class until it is forgotten", func(t *testing.T) {
		rec := newImpl(t)
		if _, err := rec.Claim(t.Context(), []string{"r1.2"}, round.OutcomeScheduled, []string{"n1@5"}, []ports.Class{{Class: rent.ClassSpot, Priority: 3}}); err != nil {
			t.Fatal(err)
		}
		classes, err := rec.Classes(t.Context(), []string{"r1", "r2"})
		if err != nil || len(classes) != 1 || classes["r1"] != (ports.Class{Class: rent.ClassSpot, Priority: 3}) {
			t.Fatalf("Classes = %v, %v", classes, err)
		}
		if placed, err := rec.Placed(t.Context(), "r1"); !placed || err != nil {
			t.Fatalf("Placed = %v, %v", placed, err)
		}
		if err := rec.Forget(t.Context(), "r1"); err != nil {
			t.Fatal(err)
		}
		if placed, err := rec.Placed(t.Context(), "r1"); placed || err != nil {
			t.Fatalf("Placed after Forget = %v, %v", placed, err)
		}
	})
	t.Run("the current attempt is the latest one with an outcome", func(t *testing.T) {
		rec := newImpl(t)
		if _, err := rec.Claim(t.Context(), []string{"r1", ports.AttemptKey("r1", 2)}, round.OutcomeScheduled, []string{"a", "b"}, nil); err != nil {
			t.Fatal(err)
		}
		if later, err := rec.PlacedAfter(t.Context(), "r1", 1); !later || err != nil {
			t.Fatalf("PlacedAfter(1) = %v, %v", later, err)
		}
		if later, err := rec.PlacedAfter(t.Context(), "r1", 2); later || err != nil {
			t.Fatalf("PlacedAfter(2) = %v, %v", later, err)
		}
		for rental, want := range map[string]int32{"r1": 2, "never-placed": 1} {
			if got, err := rec.CurrentAttempt(t.Context(), rental); got != want || err != nil {
				t.Fatalf("CurrentAttempt(%s) = %d, %v; want %d", rental, got, err, want)
			}
		}
	})
	t.Run("pending entries read back until claimed or dropped", func(t *testing.T) { pendingContract(t, newImpl(t)) })
	t.Run("a victim is preempted for one rental only, until its record is dropped", func(t *testing.T) { preemptContract(t, newImpl(t)) })
}

// preemptContract: a preemption claim is all or nothing, once per victim.
func preemptContract(t *testing.T, rec ports.OutcomeRecords) {
	t.Helper()
	notice := time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC)
	victim := func(v, preemptor string) ports.Preemption {
		return ports.Preemption{Victim: v, Tenant: "spotty", Preemptor: preemptor, NodeID: "n1", NodeEpoch: 2, Notice: notice}
	}
	if taken, err := rec.ClaimPreemption(t.Context(), []ports.Preemption{victim("v1", "od1"), victim("v2", "od1")}); len(taken) != 0 || err != nil {
		t.Fatalf("first claim: taken %v, %v", taken, err)
	}
	// The same preemptor again (a redelivery) keeps its claim.
	if taken, err := rec.ClaimPreemption(t.Context(), []ports.Preemption{victim("v1", "od1")}); len(taken) != 0 || err != nil {
		t.Fatalf("repeated claim: taken %v, %v", taken, err)
	}
	// Another preemptor takes nothing, not even the free victim.
	taken, err := rec.ClaimPreemption(t.Context(), []ports.Preemption{victim("v2", "od2"), victim("v3", "od2")})
	if err != nil || !slices.Equal(taken, []string{"v2"}) {
		t.Fatalf("competing claim: taken %v, %v", taken, err)
	}
	if err := rec.StopSent(t.Context(), "v1"); err != nil {
		t.Fatal(err)
	}
	if err := rec.StopSent(t.Context(), "gone"); err != nil {
		t.Fatal(err)
	}
	got, err := rec.Preemptions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b ports.Preemption) int { return strings.Compare(a.Victim, b.Victim) })
	sent := victim("v1", "od1")
	sent.StopSent = true
	if len(got) != 2 || got[0] != sent || got[1] != victim("v2", "od1") {
		t.Fatalf("Preemptions = %+v", got)
	}
	if err := rec.Forget(t.Context(), "v1"); err != nil {
		t.Fatal(err)
	}
	if err := rec.DropPreemption(t.Context(), "v2"); err != nil {
		t.Fatal(err)
	}
	if got, err := rec.Preemptions(t.Context()); len(got) != 0 || err != nil {
		t.Fatalf("Preemptions after the stops = %+v, %v", got, err)
	}
	if taken, err := rec.ClaimPreemption(t.Context(), []ports.Preemption{victim("v2", "od2")}); len(taken) != 0 || err != nil {
		t.Fatalf("claim after the drop: taken %v, %v", taken, err)
	}
}

// pendingContract: entries read back until claimed or dropped.
func pendingContract(t *testing.T, rec ports.OutcomeRecords) {
	until := time.Unix(1_700_000_000, 0).UTC()
	entries := []ports.PendingEntry{
		{Event: request("r1"), Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY, Attempt: 1},
		{Event: request("r2"), Reason: shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION, PreemptUntil: until, Attempt: 3,
			PreferredModels: []string{"A100-SXM4-80GB"}},
		{Event: request("r3"), Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY},
	}
	if err := rec.PutPending(t.Context(), entries); err != nil {
		t.Fatal(err)
	}
	got := pendingByRental(t, rec)
	if len(got) != 3 || !proto.Equal(got["r2"].Event, entries[1].Event) || got["r2"].Reason != entries[1].Reason ||
		!got["r2"].PreemptUntil.Equal(until) || got["r2"].Attempt != 3 || !slices.Equal(got["r2"].PreferredModels, entries[1].PreferredModels) {
		t.Fatalf("Pending = %+v", got)
	}
	if _, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeRejected, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := rec.DropPending(t.Context(), "r3"); err != nil {
		t.Fatal(err)
	}
	if got := pendingByRental(t, rec); len(got) != 1 || got["r2"].Event == nil {
		t.Fatalf("Pending after a claim and a drop = %+v, want r2 only", got)
	}
}

func pendingByRental(t *testing.T, rec ports.OutcomeRecords) map[string]ports.PendingEntry {
	t.Helper()
	entries, bad, err := rec.Pending(t.Context())
	if err != nil || len(bad) > 0 {
		t.Fatalf("Pending: bad %v, %v", bad, err)
	}
	out := map[string]ports.PendingEntry{}
	for _, e := range entries {
		out[e.Event.GetRentalId()] = e
	}
	return out
}

func request(id string) *shizuv1.RentalRequested {
	return &shizuv1.RentalRequested{
		Meta:     shizuv1.NewMeta("req:"+id, "test", "", id, time.Unix(1_700_000_000, 0)),
		RentalId: id, TenantId: "tenant-a",
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 500, VramMib: 1024, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
	}
}

// RunPublisherContract checks what the scheduler relies on of a
// Publisher: a batch's events are acknowledged by one Wait, an empty
// batch waits for nothing, and a repeat of an event (same event id) is
// not an error. newImpl returns a publisher whose bus stores the rental
// subjects (rental.<tenant>.pending).
func RunPublisherContract(t *testing.T, newImpl func(t *testing.T) ports.Publisher) {
	t.Helper()
	pending := func(id string) *shizuv1.RentalPending {
		return &shizuv1.RentalPending{
			Meta:     shizuv1.NewMeta("rental:"+id+":pending:1", "scheduler", "req:"+id, id, time.Unix(1_700_000_000, 0)),
			RentalId: id, TenantId: "tenant-a", Reason: shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY,
			Deadline: timestamppb.New(time.Unix(1_700_000_600, 0)), Message: "waiting for capacity",
		}
	}
	subj, err := subject.Format(subject.RentalPending, "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("an empty batch waits for nothing", func(t *testing.T) {
		if err := newImpl(t).NewBatch().Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a batch's events are acknowledged together, repeats included", func(t *testing.T) {
		pub := newImpl(t)
		b := pub.NewBatch()
		for _, ev := range []*shizuv1.RentalPending{pending("r1"), pending("r2"), pending("r1")} {
			if err := b.Publish(t.Context(), subj, ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		again := pub.NewBatch()
		if err := again.Publish(t.Context(), subj, pending("r2")); err != nil {
			t.Fatal(err)
		}
		if err := again.Wait(t.Context()); err != nil {
			t.Fatalf("a repeat in a later batch: %v", err)
		}
	})
}
