package capacity_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// A GPU reported failed takes no new reservation, in Reserve and in
// ReserveMany, while the node's other GPUs do; what it holds stays; the
// mark shows in every reader's snapshot, survives a registration and is
// cleared by a healthy report.
func TestGPUHealth(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t)
	ctx := t.Context()
	epoch := mustRegister(t, s, gpuNode("n1", 2))
	mustReserve(t, s, place("before", "n1", epoch, share(1, 250, 1024)))

	v := mustVersion(t, s)
	if changed, err := s.SetGPUHealth(ctx, "n1", epoch, 1, capacity.HealthFailed); err != nil || !changed {
		t.Fatalf("mark GPU 1 failed: %v %v", changed, err)
	}
	if mustVersion(t, s) == v {
		t.Fatal("a health change must move the version, so other readers refresh")
	}
	if changed, err := s.SetGPUHealth(ctx, "n1", epoch, 1, capacity.HealthFailed); err != nil || changed {
		t.Fatalf("the same report again changes nothing: %v %v", changed, err)
	}
	other := storeOn(t, rdb)
	snap, err := other.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g := snap.Nodes[0].FreeGPUs
	if g[1].Health != capacity.HealthFailed || g[1].Healthy() || !g[0].Healthy() {
		t.Fatalf("another store's snapshot: %+v", g)
	}
	if _, err := s.Reserve(ctx, place("r1", "n1", epoch, share(1, 250, 1024))); !capacity.IsConflict(err) {
		t.Fatalf("reserve on the failed GPU: want a conflict, got %v", err)
	}
	res := s.ReserveMany(ctx, []capacity.Placement{place("r2", "n1", epoch, share(0, 250, 1024)), place("r3", "n1", epoch, share(0, 250, 1024), share(1, 250, 1024))})
	if res[0].Err != nil || !capacity.IsConflict(res[1].Err) {
		t.Fatalf("batch: healthy GPU 0 %v, GPU 0+1 %v", res[0].Err, res[1].Err)
	}
	st := mustNode(t, s, "n1")
	if len(st.Allocations) != 2 || st.FreeGPUs[1].Sharers != 1 {
		t.Fatalf("the failed GPU keeps what it held and takes nothing: %+v", st)
	}

	// A new registration (changed facts) keeps the mark.
	n := gpuNode("n1", 2)
	n.Labels = map[string]string{"pool": "other"}
	mustRegister(t, s, n)
	if st := mustNode(t, s, "n1"); st.FreeGPUs[1].Health != capacity.HealthFailed {
		t.Fatalf("after registering again: %+v", st.FreeGPUs[1])
	}

	if changed, err := s.SetGPUHealth(ctx, "n1", epoch, 1, capacity.HealthHealthy); err != nil || !changed {
		t.Fatalf("mark GPU 1 healthy: %v %v", changed, err)
	}
	if st := mustNode(t, s, "n1"); !st.FreeGPUs[1].Healthy() || st.FreeGPUs[1].Health != "" {
		t.Fatalf("healthy again: %+v", st.FreeGPUs[1])
	}
	mustReserve(t, s, place("r1", "n1", epoch, share(1, 250, 1024)))
}

func TestSetGPUHealthRefusesBadReports(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := t.Context()
	epoch := mustRegister(t, s, gpuNode("n1", 2))
	mustRegister(t, s, gpuNode("dead", 1))
	if _, err := s.Fence(ctx, "dead", 1); err != nil {
		t.Fatal(err)
	}
	v := mustVersion(t, s)
	for name, c := range map[string]struct {
		node  string
		epoch uint64
		gpu   int
		h     capacity.GPUHealth
		is    func(error) bool
	}{
		"an unknown node is not found":            {"nowhere", 1, 0, capacity.HealthFailed, capacity.IsNotFound},
		"a report about an older epoch is fenced": {"n1", epoch + 1, 0, capacity.HealthFailed, capacity.IsFenced},
		"a report about a dead node is fenced":    {"dead", 1, 0, capacity.HealthFailed, capacity.IsFenced},
		"a GPU the node does not have is invalid": {"n1", epoch, 2, capacity.HealthFailed, capacity.IsInvalid},
		"a negative GPU index is invalid":         {"n1", epoch, -1, capacity.HealthFailed, capacity.IsInvalid},
		"an unknown health is invalid":            {"n1", epoch, 0, "sick", capacity.IsInvalid},
		"epoch 0 is invalid":                      {"n1", 0, 0, capacity.HealthFailed, capacity.IsInvalid},
	} {
		if _, err := s.SetGPUHealth(ctx, c.node, c.epoch, c.gpu, c.h); !c.is(err) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	if mustVersion(t, s) != v {
		t.Fatal("a refused report changed the store")
	}
}
