// Package capacitytest is the contract every capacity store keeps: the
// Redis store (capacity.Store, against a real Redis from shared/testkit)
// and the in-memory store (memstore) both run it.
package capacitytest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Run runs the contract against the stores newStore returns: each call
// returns a fresh, empty store.
func Run(t *testing.T, newStore func(t *testing.T) capacity.Interface) {
	for _, c := range []struct {
		name string
		run  func(t *testing.T, s capacity.Interface)
	}{
		{"a reserve takes all of a placement or nothing", allOrNothing},
		{"a reserve is idempotent per rental id", idempotent},
		{"a fenced node takes and keeps no work until it registers again", fencing},
		{"a release gives back exactly what was taken, once", release},
		{"a GPU takes no more sharers than its limit", sharers},
		{"a MIG share takes a free instance of its profile on a GPU in MIG mode", mig},
		{"a handed-over allocation keeps its capacity until released on its node", handOver},
		{"a GPU that is not healthy takes no new work", health},
		{"a node that holds allocations cannot be removed", remove},
		{"input that fails validation is invalid and changes nothing", invalidInput},
		{"a store has one generation from its first registration on", generation},
		{"a restore brings a lost node back with its allocations in one step", restore},
		{"a rental two nodes restore stays with the higher attempt", restoreMoved},
		{"a restore whose allocations do not fit writes nothing", restoreMisfit},
		{"a reserve past the tenant's total quota is refused, naming the limit, and changes nothing", quotaTotal},
		{"a reserve past the tenant's quota on a model is refused; other models count towards the total", quotaPerModel},
		{"a tenant's usage follows release, hand-over, release on a node and fencing exactly", quotaCounters},
		{"a restore counts what it brings back once and takes away what it overtakes", quotaRestore},
		{"a quota that fails validation is invalid and changes nothing", quotaInvalid},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
	}
}

// node is a valid node with n whole 80 GiB GPUs, 64 cores and 512 GiB.
func node(id string, n int) capacity.Node {
	nd := capacity.Node{ID: id, Zone: "zone-a", Market: capacity.MarketOnDemand, PricePerGPUHourMicros: 2_500_000,
		Currency: "USD", CPUMilli: 64_000, MemoryMiB: 512 * 1024}
	for i := range n {
		nd.GPUs = append(nd.GPUs, capacity.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM-80GB",
			VRAMMiB: 80 * 1024, MIGCapable: true})
	}
	return nd
}

// migNode is node(id, 2) with GPU 1 in MIG mode: instances <id>-a
// (1g.10gb) and <id>-b (3g.40gb).
func migNode(id string) capacity.Node {
	n := node(id, 2)
	n.GPUs[1].MIGEnabled = true
	n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-" + id + "-a", Profile: "1g.10gb", VRAMMiB: 9856},
		{UUID: "MIG-" + id + "-b", Profile: "3g.40gb", VRAMMiB: 40192}}
	return n
}

// placement is rental on whole GPUs of node at epoch.
func placement(rental, nodeID string, epoch uint64, gpus ...int) capacity.Placement {
	p := capacity.Placement{RentalID: rental, NodeID: nodeID, Epoch: epoch, Tenant: "acme", CPUMilli: 8000, MemoryMiB: 64 * 1024}
	for _, i := range gpus {
		p.GPUs = append(p.GPUs, capacity.GPUShare{Index: i, Milli: capacity.MilliPerGPU, VRAMMiB: 80 * 1024})
	}
	return p
}

func register(t *testing.T, s capacity.Interface, n capacity.Node) uint64 {
	t.Helper()
	epoch, err := s.Register(t.Context(), n)
	if err != nil {
		t.Fatalf("register %s: %v", n.ID, err)
	}
	return epoch
}

func reserve(t *testing.T, s capacity.Interface, p capacity.Placement) capacity.Allocation {
	t.Helper()
	a, err := s.Reserve(t.Context(), p)
	if err != nil {
		t.Fatalf("reserve %s on %s: %v", p.RentalID, p.NodeID, err)
	}
	return a
}

func state(t *testing.T, s capacity.Interface, id string) capacity.NodeState {
	t.Helper()
	st, err := s.Node(t.Context(), id)
	if err != nil {
		t.Fatalf("read node %s: %v", id, err)
	}
	return st
}

// insufficient fails t unless err says node lacks resource on gpu.
func insufficient(t *testing.T, err error, gpu int, resource string) {
	t.Helper()
	var ie *capacity.InsufficientError
	if !errors.As(err, &ie) || !capacity.IsInsufficient(err) || ie.GPU != gpu || ie.Resource != resource {
		t.Fatalf("got %v; want insufficient %s on GPU %d", err, resource, gpu)
	}
}

func allOrNothing(t *testing.T, s capacity.Interface) {
	epoch := register(t, s, node("n1", 2))
	before := state(t, s, "n1")
	p := placement("r1", "n1", epoch, 0, 1)
	p.GPUs[1].VRAMMiB = 81 * 1024 // more than GPU 1 has
	_, err := s.Reserve(t.Context(), p)
	insufficient(t, err, 1, capacity.ResourceVRAM)
	if after := state(t, s, "n1"); !slices.Equal(after.FreeGPUs[0].FreeMIGInstances, before.FreeGPUs[0].FreeMIGInstances) ||
		after.FreeGPUs[0].Milli != capacity.MilliPerGPU || after.FreeCPUMilli != before.FreeCPUMilli || len(after.Allocations) != 0 {
		t.Fatalf("a refused reserve took something: %+v", after)
	}
	if _, err := s.Allocation(t.Context(), "r1"); !capacity.IsNotFound(err) {
		t.Fatalf("refused rental recorded: %v", err)
	}
	p.CPUMilli = 65_000
	_, err = s.Reserve(t.Context(), p)
	insufficient(t, err, -1, capacity.ResourceCPU)
	a := reserve(t, s, placement("r1", "n1", epoch, 0, 1))
	if a.Existing || a.CreatedAt.IsZero() {
		t.Fatalf("new allocation %+v", a)
	}
	st := state(t, s, "n1")
	if st.FreeCPUMilli != 64_000-8000 || st.FreeGPUs[0].Milli != 0 || st.FreeGPUs[1].VRAMMiB != 0 || st.FreeGPUs[1].Sharers != 1 {
		t.Fatalf("after reserve: %+v", st)
	}
}

func idempotent(t *testing.T, s capacity.Interface) {
	e1 := register(t, s, node("n1", 2))
	e2 := register(t, s, node("n2", 2))
	first := reserve(t, s, placement("r1", "n1", e1, 0))
	again := reserve(t, s, placement("r1", "n2", e2, 0, 1))
	if !again.Existing || again.NodeID != "n1" || !slices.Equal(again.GPUs, first.GPUs) {
		t.Fatalf("second reserve of r1 = %+v; want the first allocation, existing", again)
	}
	if st := state(t, s, "n2"); len(st.Allocations) != 0 || st.FreeGPUs[0].Milli != capacity.MilliPerGPU {
		t.Fatalf("the second reserve took capacity on n2: %+v", st)
	}
	if st := state(t, s, "n1"); st.FreeGPUs[0].Sharers != 1 {
		t.Fatalf("r1 counted twice on n1: %+v", st.FreeGPUs[0])
	}
	res := s.ReserveMany(t.Context(), []capacity.Placement{placement("r2", "n2", e2, 0), placement("r2", "n2", e2, 1),
		placement("r3", "n2", e2, 0)})
	if res[0].Err != nil || !res[1].Allocation.Existing || res[1].Allocation.GPUs[0].Index != 0 {
		t.Fatalf("ReserveMany of r2 twice: %+v", res[:2])
	}
	insufficient(t, res[2].Err, 0, capacity.ResourceMilliGPU)
}

func fencing(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, node("n1", 2))
	reserve(t, s, placement("r1", "n1", epoch, 0))
	f, err := s.Fence(ctx, "n1", epoch)
	if err != nil || f.Epoch != epoch+1 || len(f.Allocations) != 1 || f.Allocations[0].RentalID != "r1" {
		t.Fatalf("fence = %+v, %v; want epoch %d with r1", f, err, epoch+1)
	}
	if _, err := s.Fence(ctx, "n1", epoch); !capacity.IsConflict(err) {
		t.Fatalf("second fence at the old epoch: %v; want a conflict", err)
	}
	if st := state(t, s, "n1"); st.Status != capacity.StatusDead || st.FreeGPUs[0].Milli != 0 {
		t.Fatalf("fenced node %s, GPU 0 free %d; want dead, r1's capacity kept until released", st.Status, st.FreeGPUs[0].Milli)
	}
	for name, err := range map[string]error{
		"reserve at the old epoch": func() error { _, err := s.Reserve(ctx, placement("r2", "n1", epoch, 1)); return err }(),
		"reserve at the new epoch": func() error { _, err := s.Reserve(ctx, placement("r2", "n1", epoch+1, 1)); return err }(),
		"renew":                    s.Renew(ctx, "r1", "n1", epoch),
		"set status":               s.SetStatus(ctx, "n1", capacity.StatusReady, epoch+1),
	} {
		if !capacity.IsFenced(err) {
			t.Errorf("%s on a dead node: %v; want fenced", name, err)
		}
	}
	if e := register(t, s, node("n1", 2)); e != epoch+1 {
		t.Fatalf("registered again at epoch %d; want %d (the fence's)", e, epoch+1)
	}
	if err := s.Renew(ctx, "r1", "n1", epoch+1); !capacity.IsFenced(err) {
		t.Fatalf("renew of an allocation made before the fence: %v; want fenced", err)
	}
	reserve(t, s, placement("r2", "n1", epoch+1, 1))
	if err := s.Renew(ctx, "r2", "n1", epoch+1); err != nil {
		t.Fatalf("renew under the new epoch: %v", err)
	}
	if err := s.SetStatus(ctx, "n1", capacity.StatusDraining, epoch); !capacity.IsConflict(err) {
		t.Fatalf("set status at a stale epoch: %v; want a conflict", err)
	}
	if err := s.SetStatus(ctx, "n1", capacity.StatusDraining, epoch+1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, placement("r3", "n1", epoch+1, 1)); !capacity.IsConflict(err) {
		t.Fatalf("reserve on a draining node: %v; want a conflict", err)
	}
}

func release(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, node("n1", 2))
	before := state(t, s, "n1")
	reserve(t, s, placement("r1", "n1", epoch, 0, 1))
	v1, err := s.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Release(ctx, "r1"); err != nil || !ok {
		t.Fatalf("release r1 = %v, %v", ok, err)
	}
	after := state(t, s, "n1")
	after.Allocations = nil
	if after.FreeCPUMilli != before.FreeCPUMilli || after.FreeMemoryMiB != before.FreeMemoryMiB ||
		!slices.EqualFunc(after.FreeGPUs, before.FreeGPUs, func(a, b capacity.FreeGPU) bool {
			return a.Milli == b.Milli && a.VRAMMiB == b.VRAMMiB && a.Sharers == b.Sharers
		}) {
		t.Fatalf("after release %+v; want %+v", after, before)
	}
	if v2, _ := s.Version(ctx); v2 <= v1 {
		t.Fatalf("version %d after a release, %d before", v2, v1)
	}
	if ok, err := s.Release(ctx, "r1"); err != nil || ok {
		t.Fatalf("second release = %v, %v; want false, nil", ok, err)
	}
	if ok, err := s.Release(ctx, "never"); err != nil || ok {
		t.Fatalf("release of an unknown rental = %v, %v", ok, err)
	}
	if _, err := s.Allocation(ctx, "r1"); !capacity.IsNotFound(err) {
		t.Fatalf("released rental still recorded: %v", err)
	}
}

func sharers(t *testing.T, s capacity.Interface) {
	n := node("n1", 1)
	n.GPUs[0].MaxSharers = 2
	epoch := register(t, s, n)
	share := func(rental string) capacity.Placement {
		p := placement(rental, "n1", epoch)
		p.GPUs = []capacity.GPUShare{{Index: 0, Milli: 250, VRAMMiB: 10 * 1024}}
		return p
	}
	reserve(t, s, share("r1"))
	reserve(t, s, share("r2"))
	_, err := s.Reserve(t.Context(), share("r3"))
	insufficient(t, err, 0, capacity.ResourceSharers)
	if g := state(t, s, "n1").FreeGPUs[0]; g.Sharers != 2 || g.MaxSharers != 2 || g.Milli != 500 {
		t.Fatalf("GPU 0 %+v; want 2 of 2 sharers, 500 milli free", g)
	}
}

func mig(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, migNode("n1"))
	share := func(rental string, gpu int, profile, instance string) capacity.Placement {
		p := placement(rental, "n1", epoch)
		p.GPUs = []capacity.GPUShare{{Index: gpu, Milli: 143, VRAMMiB: 9856, MIGProfile: profile, MIGInstance: instance}}
		return p
	}
	for name, p := range map[string]capacity.Placement{
		"a MIG share on a GPU not in MIG mode":    share("r0", 0, "1g.10gb", "MIG-n1-a"),
		"a whole-GPU share on a GPU in MIG mode":  share("r0", 1, "", ""),
		"a MIG share naming an unknown instance":  share("r0", 1, "1g.10gb", "MIG-n1-z"),
		"a MIG share of another instance profile": share("r0", 1, "1g.10gb", "MIG-n1-b"),
	} {
		if _, err := s.Reserve(ctx, p); !capacity.IsConflict(err) {
			t.Errorf("%s: %v; want a conflict", name, err)
		}
	}
	reserve(t, s, share("r1", 1, "1g.10gb", "MIG-n1-a"))
	_, err := s.Reserve(ctx, share("r2", 1, "1g.10gb", "MIG-n1-a"))
	insufficient(t, err, 1, capacity.ResourceMIGInstance)
	if g := state(t, s, "n1").FreeGPUs[1]; !slices.Equal(g.FreeMIGInstances, []string{"MIG-n1-b"}) || g.MaxSharers != 2 {
		t.Fatalf("GPU 1 %+v; want only MIG-n1-b free of 2 instances", g)
	}
	if _, err := s.Release(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if g := state(t, s, "n1").FreeGPUs[1]; !slices.Equal(g.FreeMIGInstances, []string{"MIG-n1-a", "MIG-n1-b"}) {
		t.Fatalf("after release, free instances %v", g.FreeMIGInstances)
	}
}

func handOver(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	e1 := register(t, s, node("n1", 1))
	e2 := register(t, s, node("n2", 1))
	reserve(t, s, placement("r1", "n1", e1, 0))
	if _, err := s.HandOver(ctx, "r1", "n2"); !capacity.IsNotFound(err) {
		t.Fatalf("hand over from a node that does not hold it: %v; want not found", err)
	}
	old, err := s.HandOver(ctx, "r1", "n1")
	if err != nil || !old.HandingOver {
		t.Fatalf("hand over = %+v, %v", old, err)
	}
	if again, err := s.HandOver(ctx, "r1", "n1"); err != nil || !again.HandingOver {
		t.Fatalf("hand over again = %+v, %v; want the same copy", again, err)
	}
	if _, err := s.Allocation(ctx, "r1"); !capacity.IsNotFound(err) {
		t.Fatalf("a handed-over rental still has a live allocation: %v", err)
	}
	if err := s.Renew(ctx, "r1", "n1", e1); err != nil {
		t.Fatalf("the old run renews while handing over: %v", err)
	}
	if _, err := s.Reserve(ctx, placement("r1", "n1", e1, 0)); !capacity.IsConflict(err) {
		t.Fatalf("reserve of the rental on the node that still holds its previous run: %v; want a conflict", err)
	}
	next := reserve(t, s, placement("r1", "n2", e2, 0))
	if next.Existing {
		t.Fatal("the next attempt is a new allocation")
	}
	if g := state(t, s, "n1").FreeGPUs[0]; g.Milli != 0 {
		t.Fatalf("the old copy gave back its GPU before its release: %+v", g)
	}
	if got, err := s.ReleaseHandedOver(ctx, "n2", "r1"); err != nil || got[0] {
		t.Fatalf("ReleaseHandedOver of a live allocation = %v, %v; want it left alone", got, err)
	}
	if got, err := s.ReleaseHandedOver(ctx, "n1", "r1"); err != nil || !got[0] {
		t.Fatalf("ReleaseHandedOver of the old copy = %v, %v", got, err)
	}
	if a, err := s.Allocation(ctx, "r1"); err != nil || a.NodeID != "n2" {
		t.Fatalf("the next attempt after the old copy's release: %+v, %v", a, err)
	}
	if got, err := s.ReleaseOn(ctx, "n1", "r1"); err != nil || got[0] {
		t.Fatalf("ReleaseOn a node no longer holding the rental = %v, %v", got, err)
	}
	if got, err := s.ReleaseOn(ctx, "n2", "r1"); err != nil || !got[0] {
		t.Fatalf("ReleaseOn the node holding it = %v, %v", got, err)
	}
}

func health(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, node("n1", 2))
	reserve(t, s, placement("r1", "n1", epoch, 1))
	if changed, err := s.SetGPUHealth(ctx, "n1", epoch, 0, capacity.HealthDegraded); err != nil || !changed {
		t.Fatalf("degrade GPU 0 = %v, %v", changed, err)
	}
	if changed, err := s.SetGPUHealth(ctx, "n1", epoch, 0, capacity.HealthDegraded); err != nil || changed {
		t.Fatalf("degrade GPU 0 again = %v, %v; want unchanged", changed, err)
	}
	if _, err := s.Reserve(ctx, placement("r2", "n1", epoch, 0)); !capacity.IsConflict(err) {
		t.Fatalf("reserve on a degraded GPU: %v; want a conflict", err)
	}
	if _, err := s.SetGPUHealth(ctx, "n1", epoch, 1, capacity.HealthFailed); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, "r1", "n1", epoch); err != nil {
		t.Fatalf("a failed GPU keeps what it holds: %v", err)
	}
	register(t, s, node("n1", 2))
	if g := state(t, s, "n1").FreeGPUs; g[0].Health != capacity.HealthDegraded || g[0].Healthy() || g[1].Health != capacity.HealthFailed {
		t.Fatalf("health marks after registering again: %+v", g)
	}
	if _, err := s.SetGPUHealth(ctx, "n1", epoch, 0, capacity.HealthHealthy); err != nil {
		t.Fatal(err)
	}
	if g := state(t, s, "n1").FreeGPUs[0]; !g.Healthy() {
		t.Fatalf("GPU 0 reported healthy: %+v", g)
	}
	reserve(t, s, placement("r2", "n1", epoch, 0))
	if _, err := s.SetGPUHealth(ctx, "n1", epoch, 2, capacity.HealthFailed); !capacity.IsInvalid(err) {
		t.Fatalf("health of a GPU the node lacks: %v; want invalid", err)
	}
	if _, err := s.SetGPUHealth(ctx, "n1", epoch+1, 0, capacity.HealthFailed); !capacity.IsFenced(err) {
		t.Fatalf("health at another epoch: %v; want fenced", err)
	}
	if _, err := s.SetGPUHealth(ctx, "nx", 1, 0, capacity.HealthFailed); !capacity.IsNotFound(err) {
		t.Fatalf("health of an unknown node: %v; want not found", err)
	}
}

func remove(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, node("n1", 1))
	reserve(t, s, placement("r1", "n1", epoch, 0))
	if err := s.Remove(ctx, "n1"); !capacity.IsConflict(err) {
		t.Fatalf("remove a node holding r1: %v; want a conflict", err)
	}
	if _, err := s.Release(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "n1"); !capacity.IsNotFound(err) {
		t.Fatalf("remove again: %v; want not found", err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil || len(snap.Nodes) != 0 {
		t.Fatalf("snapshot after remove: %+v, %v", snap, err)
	}
	if e := register(t, s, node("n1", 1)); e != 1 {
		t.Fatalf("a removed node registered again at epoch %d; want 1", e)
	}
}

func invalidInput(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	epoch := register(t, s, node("n1", 1))
	v, _ := s.Version(ctx)
	bad := node("n2", 1)
	bad.Currency = ""
	if _, err := s.Register(ctx, bad); !capacity.IsInvalid(err) {
		t.Errorf("register without a currency: %v", err)
	}
	if _, err := s.Reserve(ctx, placement("", "n1", epoch, 0)); !capacity.IsInvalid(err) {
		t.Errorf("reserve without a rental id: %v", err)
	}
	if _, err := s.Release(ctx, "bad id"); !capacity.IsInvalid(err) {
		t.Errorf("release of %q: %v", "bad id", err)
	}
	if _, err := s.Fence(ctx, "n1", 0); !capacity.IsInvalid(err) {
		t.Errorf("fence at epoch 0: %v", err)
	}
	if err := s.SetStatus(ctx, "n1", capacity.StatusDead, epoch); !capacity.IsInvalid(err) {
		t.Errorf("set status dead: %v", err)
	}
	if after, _ := s.Version(ctx); after != v {
		t.Errorf("version moved from %d to %d on invalid input", v, after)
	}
}
