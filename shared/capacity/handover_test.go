package capacity_test

import (
	"slices"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// A spot hand-over: the old run keeps its allocation (and its capacity,
// and its agent can renew it) while the rental's next attempt is reserved
// on another node; each node counts only its own copy, and releasing the
// handed-over copy gives back exactly what it took without touching the
// new allocation.
func TestAHandedOverAllocationKeepsItsCapacityWhileTheNextAttemptIsReservedElsewhere(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	ea := mustRegister(t, s, gpuNode("a", 2))
	eb := mustRegister(t, s, gpuNode("b", 2))
	mustReserve(t, s, place("r1", "a", ea, share(0, 500, 1024)))
	mustReserve(t, s, place("r2", "a", ea, share(1, 1000, 2048)))
	before := mustNode(t, s, "a")

	old, err := s.HandOver(ctx, "r1", "a")
	if err != nil || !old.HandingOver || old.NodeID != "a" {
		t.Fatalf("hand over: %+v %v", old, err)
	}
	if again, err := s.HandOver(ctx, "r1", "a"); err != nil || !again.HandingOver {
		t.Fatalf("a second hand-over is not idempotent: %+v %v", again, err)
	}
	if _, err := s.Allocation(ctx, "r1"); !capacity.IsNotFound(err) {
		t.Fatalf("the rental still has a live allocation after the hand-over: %v", err)
	}
	if err := s.Renew(ctx, "r1", "a", ea); err != nil {
		t.Fatalf("the old run can no longer renew: %v", err)
	}
	during := mustNode(t, s, "a")
	if during.FreeGPUs[0].Milli != before.FreeGPUs[0].Milli || during.FreeCPUMilli != before.FreeCPUMilli {
		t.Fatalf("the hand-over changed node a's capacity: %+v -> %+v", before.FreeGPUs[0], during.FreeGPUs[0])
	}
	if i := slices.IndexFunc(during.Allocations, func(a capacity.Allocation) bool { return a.RentalID == "r1" }); i < 0 || !during.Allocations[i].HandingOver {
		t.Fatalf("node a does not show r1 handed over: %+v", during.Allocations)
	}
	// A node holds one allocation per rental: not the old node again.
	if _, err := s.Reserve(ctx, place("r1", "a", ea, share(1, 1, 1))); !capacity.IsConflict(err) {
		t.Fatalf("reserve on the node that still holds the handed-over run: %v, want a conflict", err)
	}
	next := mustReserve(t, s, place("r1", "b", eb, share(0, 500, 1024)))
	if next.Existing {
		t.Fatal("the next attempt was answered with the handed-over allocation")
	}
	// Releasing the live allocations of node a leaves r1's next attempt.
	if got, err := s.ReleaseOn(ctx, "b", "r2"); err != nil || got[0] {
		t.Fatalf("release of r2 on b (it is on a): %v %v", got, err)
	}
	if got, err := s.ReleaseHandedOver(ctx, "a", "r2"); err != nil || got[0] {
		t.Fatalf("ReleaseHandedOver released r2's live allocation: %v %v", got, err)
	}
	if got, err := s.ReleaseHandedOver(ctx, "a", "r1"); err != nil || !got[0] {
		t.Fatalf("release of the handed-over copy: %v %v", got, err)
	}
	if got, err := s.ReleaseHandedOver(ctx, "a", "r1"); err != nil || got[0] {
		t.Fatalf("a second release: %v %v", got, err)
	}
	after := mustNode(t, s, "a")
	if after.FreeGPUs[0].Milli != capacity.MilliPerGPU || after.FreeGPUs[0].Sharers != 0 {
		t.Fatalf("node a GPU 0 after the release: %+v", after.FreeGPUs[0])
	}
	if a, err := s.Allocation(ctx, "r1"); err != nil || a.NodeID != "b" {
		t.Fatalf("the next attempt's allocation after the old one was released: %+v %v", a, err)
	}
	mustNode(t, s, "b")
}

// A node fenced during a hand-over returns the handed-over copy marked as
// such, and ReleaseOn frees what the dead node holds, live or handed over,
// never an allocation on another node.
func TestAFencedNodeReportsItsHandedOverAllocationsAndReleaseOnFreesOnlyThatNode(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	ea := mustRegister(t, s, gpuNode("a", 2))
	eb := mustRegister(t, s, gpuNode("b", 2))
	mustReserve(t, s, place("r1", "a", ea, share(0, 250, 512)))
	mustReserve(t, s, place("r2", "a", ea, share(1, 250, 512)))
	if _, err := s.HandOver(ctx, "r1", "a"); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, place("r1", "b", eb, share(0, 250, 512)))
	res, err := s.Fence(ctx, "a", ea)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Allocations) != 2 || !res.Allocations[0].HandingOver || res.Allocations[1].HandingOver {
		t.Fatalf("fence returned %+v, want r1 handed over and r2 live", res.Allocations)
	}
	got, err := s.ReleaseOn(ctx, "a", "r1", "r2")
	if err != nil || !slices.Equal(got, []bool{true, true}) {
		t.Fatalf("release on a: %v %v", got, err)
	}
	if st := mustNode(t, s, "a"); len(st.Allocations) != 0 {
		t.Fatalf("node a still holds %+v", st.Allocations)
	}
	if a, err := s.Allocation(ctx, "r1"); err != nil || a.NodeID != "b" {
		t.Fatalf("r1's allocation on b was touched: %+v %v", a, err)
	}
	if _, err := s.Allocation(ctx, "r2"); !capacity.IsNotFound(err) {
		t.Fatalf("r2 still indexed: %v", err)
	}
	if _, err := s.HandOver(ctx, "r1", "a"); !capacity.IsNotFound(err) {
		t.Fatalf("hand over of an allocation node a does not hold: %v", err)
	}
	if _, err := s.HandOver(ctx, "r1", ""); !capacity.IsInvalid(err) {
		t.Fatalf("hand over without a node: %v", err)
	}
}

// Release read the index (node a), and before its script ran the rental
// was handed over and reserved on node b: the script on a must not free
// a's handed-over copy in place of the live allocation. It says the
// rental moved, and Release, following it, frees b's allocation only.
func TestAReleaseOvertakenByAHandOverFreesTheLiveAllocationOnly(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	ea := mustRegister(t, s, gpuNode("a", 1))
	eb := mustRegister(t, s, gpuNode("b", 1))
	mustReserve(t, s, place("r1", "a", ea, share(0, 500, 1024)))
	if _, err := s.HandOver(ctx, "r1", "a"); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, place("r1", "b", eb, share(0, 500, 1024)))

	res, err := s.ReleaseLiveOn(ctx, "r1", "a") // the stale read's script
	if err != nil || len(res) != 2 || res[0] != "moved" || res[1] != "b" {
		t.Fatalf("release on the stale node = %v, %v; want moved to b", res, err)
	}
	if a := mustNode(t, s, "a"); len(a.Allocations) != 1 || !a.Allocations[0].HandingOver || a.FreeGPUs[0].Milli != 500 {
		t.Fatalf("node a lost its handed-over copy: %+v", a)
	}
	released, err := s.Release(ctx, "r1")
	if err != nil || !released {
		t.Fatalf("release = %v, %v", released, err)
	}
	if b := mustNode(t, s, "b"); len(b.Allocations) != 0 || b.FreeGPUs[0].Milli != 1000 {
		t.Fatalf("node b still holds the live allocation: %+v", b)
	}
	if a := mustNode(t, s, "a"); len(a.Allocations) != 1 {
		t.Fatalf("Release freed node a's handed-over copy: %+v", a)
	}
}
