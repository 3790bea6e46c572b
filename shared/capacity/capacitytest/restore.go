package capacitytest

import (
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// The contract of a store that was lost (an empty Redis): generation and
// Restore. A fresh store from newStore is the lost store's empty successor.

func generation(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	if g, err := s.Generation(ctx); err != nil || g != "" {
		t.Fatalf("an empty store's generation = %q, %v; want none", g, err)
	}
	reg, err := s.Join(ctx, node("n1", 1))
	if err != nil || reg.Epoch != 1 || reg.Generation == "" {
		t.Fatalf("join = %+v, %v; want epoch 1 and a generation", reg, err)
	}
	again, err := s.Join(ctx, node("n2", 1))
	if err != nil || again.Generation != reg.Generation {
		t.Fatalf("a second join got generation %q, %v; want the first's %q", again.Generation, err, reg.Generation)
	}
	if _, err := s.Register(ctx, node("n1", 1)); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.Generation(ctx); g != reg.Generation {
		t.Fatalf("generation moved to %q on a registration; want %q", g, reg.Generation)
	}
}

// attemptOf is p with attempt a.
func attemptOf(p capacity.Placement, a int32) capacity.Placement {
	p.Attempt = a
	return p
}

func restore(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	in := capacity.RestoreInput{Node: node("n1", 2), Epoch: 3, Placements: []capacity.Placement{
		attemptOf(placement("r1", "n1", 3, 0), 1), attemptOf(placement("r2", "n1", 3, 1), 2)}}
	got, err := s.Restore(ctx, in)
	if err != nil || !got.Restored || got.Epoch != 3 || got.Generation == "" || len(got.Lost) != 0 {
		t.Fatalf("restore = %+v, %v; want restored at epoch 3 in a new generation, nothing lost", got, err)
	}
	if g, _ := s.Generation(ctx); g != got.Generation {
		t.Fatalf("store generation %q, restore said %q", g, got.Generation)
	}
	st := state(t, s, "n1")
	if st.Epoch != 3 || st.Status != capacity.StatusReady || len(st.Allocations) != 2 ||
		st.FreeGPUs[0].Milli != 0 || st.FreeGPUs[1].Milli != 0 || st.FreeCPUMilli != 64_000-16_000 {
		t.Fatalf("restored node %+v; want epoch 3, ready, both GPUs taken", st)
	}
	if a, err := s.Allocation(ctx, "r2"); err != nil || a.NodeID != "n1" || a.Attempt != 2 {
		t.Fatalf("r2 = %+v, %v; want on n1, attempt 2", a, err)
	}
	for _, r := range []string{"r1", "r2"} {
		if err := s.Renew(ctx, r, "n1", 3); err != nil {
			t.Fatalf("renew %s after restore: %v", r, err)
		}
	}
	if _, err := s.Reserve(ctx, placement("r3", "n1", 3, 0)); !capacity.IsInsufficient(err) {
		t.Fatalf("reserve onto a restored GPU: %v; want insufficient", err)
	}
	// A repeat (its reply was lost) changes nothing; a draining flag on it
	// does not override what is stored.
	in.Draining = true
	if again, err := s.Restore(ctx, in); err != nil || !again.Restored || again.Generation != got.Generation {
		t.Fatalf("repeated restore = %+v, %v", again, err)
	}
	if st := state(t, s, "n1"); len(st.Allocations) != 2 || st.FreeGPUs[0].Sharers != 1 || st.Status != capacity.StatusReady {
		t.Fatalf("after a repeated restore: %+v", st)
	}
	if released, err := s.Release(ctx, "r1"); err != nil || !released {
		t.Fatalf("release of a restored rental: %v, %v", released, err)
	}
	if st := state(t, s, "n1"); st.FreeGPUs[0].Milli != capacity.MilliPerGPU {
		t.Fatalf("release did not give GPU 0 back: %+v", st.FreeGPUs[0])
	}
	// The store holds the node at another epoch (fenced since): nothing is
	// written.
	if _, err := s.Fence(ctx, "n1", 3); err != nil {
		t.Fatal(err)
	}
	in.Placements = []capacity.Placement{attemptOf(placement("r4", "n1", 3, 0), 1)}
	if got, err := s.Restore(ctx, in); err != nil || got.Restored || got.Epoch != 4 {
		t.Fatalf("restore of a fenced node = %+v, %v; want not restored, epoch 4", got, err)
	}
	if _, err := s.Allocation(ctx, "r4"); !capacity.IsNotFound(err) {
		t.Fatalf("restore of a fenced node wrote r4: %v", err)
	}
	// A draining node comes back draining; a GPU its agent knows failed
	// comes back failed, and takes no new work.
	d := capacity.RestoreInput{Node: node("n2", 2), Epoch: 1, Draining: true,
		Health: map[int]capacity.GPUHealth{0: capacity.HealthFailed, 1: capacity.HealthHealthy}}
	if _, err := s.Restore(ctx, d); err != nil {
		t.Fatal(err)
	}
	st = state(t, s, "n2")
	if st.Status != capacity.StatusDraining || st.FreeGPUs[0].Health != capacity.HealthFailed || !st.FreeGPUs[1].Healthy() {
		t.Fatalf("restored node %s, GPU health %q and %q; want draining, GPU 0 failed, GPU 1 healthy", st.Status, st.FreeGPUs[0].Health, st.FreeGPUs[1].Health)
	}
	if err := s.SetStatus(ctx, "n2", capacity.StatusReady, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, placement("r5", "n2", 1, 0)); !capacity.IsConflict(err) {
		t.Fatalf("reserve on the restored failed GPU: %v; want a conflict", err)
	}
}

func restoreMoved(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	// r1 moved from n1 (attempt 1, a zombie there) to n2 (attempt 2).
	old := capacity.RestoreInput{Node: node("n1", 1), Epoch: 1, Placements: []capacity.Placement{attemptOf(placement("r1", "n1", 1, 0), 1)}}
	moved := capacity.RestoreInput{Node: node("n2", 1), Epoch: 2, Placements: []capacity.Placement{attemptOf(placement("r1", "n2", 2, 0), 2)}}
	if got, err := s.Restore(ctx, old); err != nil || len(got.Lost) != 0 {
		t.Fatalf("restore n1 = %+v, %v", got, err)
	}
	got, err := s.Restore(ctx, moved)
	if err != nil || len(got.Lost) != 0 {
		t.Fatalf("restore n2 = %+v, %v; want r1 won by the later attempt", got, err)
	}
	if a, err := s.Allocation(ctx, "r1"); err != nil || a.NodeID != "n2" || a.Attempt != 2 {
		t.Fatalf("r1 = %+v, %v; want on n2 at attempt 2", a, err)
	}
	if st := state(t, s, "n1"); len(st.Allocations) != 0 || st.FreeGPUs[0].Milli != capacity.MilliPerGPU || st.FreeGPUs[0].Sharers != 0 {
		t.Fatalf("n1 still holds the overtaken copy: %+v", st)
	}
	if err := s.Renew(ctx, "r1", "n1", 1); !capacity.IsNotFound(err) {
		t.Fatalf("renew of the overtaken copy: %v; want not found (its agent stops it)", err)
	}
	// The old copy restored after the new one loses.
	s2 := capacity.RestoreInput{Node: node("n1", 1), Epoch: 1, Placements: []capacity.Placement{
		attemptOf(placement("r1", "n1", 1, 0), 1)}}
	got, err = s.Restore(ctx, s2)
	if err != nil || len(got.Lost) != 1 || got.Lost[0] != (capacity.LostRental{RentalID: "r1", NodeID: "n2", Attempt: 2}) {
		t.Fatalf("restore of the older attempt = %+v, %v; want r1 lost to n2's attempt 2", got, err)
	}
	if st := state(t, s, "n1"); len(st.Allocations) != 0 || st.FreeGPUs[0].Milli != capacity.MilliPerGPU {
		t.Fatalf("the lost rental took capacity on n1: %+v", st)
	}
}

func restoreMisfit(t *testing.T, s capacity.Interface) {
	in := capacity.RestoreInput{Node: node("n1", 1), Epoch: 1, Placements: []capacity.Placement{
		placement("r1", "n1", 1, 0), placement("r2", "n1", 1, 0)}}
	if _, err := s.Restore(t.Context(), in); !capacity.IsConflict(err) {
		t.Fatalf("restore of two whole-GPU rentals on one GPU: %v; want a conflict", err)
	}
	if _, err := s.Node(t.Context(), "n1"); !capacity.IsNotFound(err) {
		t.Fatalf("a refused restore wrote the node: %v", err)
	}
	bad := capacity.RestoreInput{Node: node("n1", 1), Epoch: 1, Placements: []capacity.Placement{placement("r1", "n2", 1, 0)}}
	if _, err := s.Restore(t.Context(), bad); !capacity.IsInvalid(err) {
		t.Fatalf("restore of a placement on another node: %v; want invalid", err)
	}
}
