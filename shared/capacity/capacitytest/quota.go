package capacitytest

import (
	"errors"
	"maps"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

const h100 = "H100-SXM-80GB"

// modelNode is node(id, n) with GPUs of model.
func modelNode(id string, n int, model string) capacity.Node {
	nd := node(id, n)
	for i := range nd.GPUs {
		nd.GPUs[i].Model = model
	}
	return nd
}

// fraction is rental on milli of GPU gpu of node at epoch.
func fraction(rental, nodeID string, epoch uint64, gpu int, milli int64) capacity.Placement {
	p := placement(rental, nodeID, epoch)
	p.CPUMilli, p.MemoryMiB = 1000, 1024
	p.GPUs = []capacity.GPUShare{{Index: gpu, Milli: milli, VRAMMiB: 10 * 1024}}
	return p
}

func withQuota(p capacity.Placement, maxGPUs int64, perModel map[string]int64) capacity.Placement {
	p.Quota = &capacity.Quota{MaxGPUs: maxGPUs, PerModel: perModel}
	return p
}

// usageIs fails t unless tenant acme's usage is total milli-GPU in all and
// perModel by model, and equals what the snapshot's live allocations hold.
func usageIs(t *testing.T, s capacity.Interface, total int64, perModel map[string]int64) {
	t.Helper()
	u, err := s.Usage(t.Context(), "acme")
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if perModel == nil {
		perModel = map[string]int64{}
	}
	if u.MilliGPU != total || !maps.Equal(u.PerModel, perModel) {
		t.Fatalf("usage = %d %v; want %d %v", u.MilliGPU, u.PerModel, total, perModel)
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	heldBy := map[string]int64{}
	for _, n := range snap.Nodes {
		for _, a := range n.Allocations {
			if a.HandingOver || a.Tenant != "acme" {
				continue
			}
			for _, g := range a.GPUs {
				held += g.Milli
				heldBy[n.GPUs[g.Index].Model] += g.Milli
			}
		}
	}
	if held != u.MilliGPU || !maps.Equal(heldBy, u.PerModel) {
		t.Fatalf("usage %d %v, but the live allocations hold %d %v", u.MilliGPU, u.PerModel, held, heldBy)
	}
}

// overQuota fails t unless err is a QuotaError naming model's limit.
func overQuota(t *testing.T, err error, model string, limit, used, want int64) {
	t.Helper()
	var qe *capacity.QuotaError
	if !errors.As(err, &qe) || !capacity.IsQuota(err) {
		t.Fatalf("got %v; want over quota", err)
	}
	if qe.Tenant != "acme" || qe.Model != model || qe.Limit != limit || qe.Used != used || qe.Want != want {
		t.Fatalf("quota error %+v; want model %q limit %d used %d want %d", *qe, model, limit, used, want)
	}
}

func quotaTotal(t *testing.T, s capacity.Interface) {
	e1 := register(t, s, node("n1", 4))
	usageIs(t, s, 0, nil)
	reserve(t, s, withQuota(placement("r1", "n1", e1, 0), 2, nil))
	reserve(t, s, withQuota(fraction("r2", "n1", e1, 1, 500), 2, nil))
	usageIs(t, s, 1500, map[string]int64{h100: 1500})
	before := state(t, s, "n1")
	_, err := s.Reserve(t.Context(), withQuota(placement("r3", "n1", e1, 2), 2, nil))
	overQuota(t, err, "", 2, 1500, 1000)
	if after := state(t, s, "n1"); !sameFree(before, after) || len(after.Allocations) != 2 {
		t.Fatalf("a reserve over quota changed the node: %+v", after.FreeGPUs)
	}
	usageIs(t, s, 1500, map[string]int64{h100: 1500})
	// Exactly up to the limit is allowed; a repeat is idempotent, not
	// counted again, whatever the quota says now.
	reserve(t, s, withQuota(fraction("r3", "n1", e1, 2, 500), 2, nil))
	if a := reserve(t, s, withQuota(fraction("r3", "n1", e1, 2, 500), 0, nil)); !a.Existing {
		t.Fatal("a repeated reserve over quota is not the existing allocation")
	}
	usageIs(t, s, 2000, map[string]int64{h100: 2000})
	// Without a quota nothing is checked, but everything is counted.
	reserve(t, s, placement("r4", "n1", e1, 3))
	usageIs(t, s, 3000, map[string]int64{h100: 3000})
	res := s.ReserveMany(t.Context(), []capacity.Placement{withQuota(fraction("r5", "n1", e1, 1, 250), 4, nil),
		withQuota(fraction("r6", "n1", e1, 1, 250), 0, nil)})
	if res[0].Err != nil {
		t.Fatalf("ReserveMany within quota: %v", res[0].Err)
	}
	overQuota(t, res[1].Err, "", 0, 3250, 250)
	usageIs(t, s, 3250, map[string]int64{h100: 3250})
	// Another tenant's usage is its own.
	other := withQuota(fraction("r7", "n1", e1, 1, 250), 1, nil)
	other.Tenant = "globex"
	reserve(t, s, other)
	usageIs(t, s, 3250, map[string]int64{h100: 3250})
}

func sameFree(a, b capacity.NodeState) bool {
	if a.FreeCPUMilli != b.FreeCPUMilli || a.FreeMemoryMiB != b.FreeMemoryMiB || len(a.FreeGPUs) != len(b.FreeGPUs) {
		return false
	}
	for i := range a.FreeGPUs {
		if a.FreeGPUs[i].Milli != b.FreeGPUs[i].Milli || a.FreeGPUs[i].Sharers != b.FreeGPUs[i].Sharers {
			return false
		}
	}
	return true
}

func quotaPerModel(t *testing.T, s capacity.Interface) {
	eh := register(t, s, modelNode("h", 2, h100))
	ea := register(t, s, modelNode("a", 2, "A100-80GB"))
	limits := map[string]int64{h100: 1}
	reserve(t, s, withQuota(placement("r1", "h", eh, 0), 3, limits))
	_, err := s.Reserve(t.Context(), withQuota(fraction("r2", "h", eh, 1, 100), 3, limits))
	overQuota(t, err, h100, 1, 1000, 100)
	// A model the quota does not name is bounded by the total alone.
	reserve(t, s, withQuota(placement("r3", "a", ea, 0, 1), 3, limits))
	usageIs(t, s, 3000, map[string]int64{h100: 1000, "A100-80GB": 2000})
	_, err = s.Reserve(t.Context(), withQuota(fraction("r4", "h", eh, 1, 100), 3, map[string]int64{h100: 2}))
	overQuota(t, err, "", 3, 3000, 100)
	if _, err := s.Release(t.Context(), "r1"); err != nil {
		t.Fatal(err)
	}
	usageIs(t, s, 2000, map[string]int64{"A100-80GB": 2000})
	reserve(t, s, withQuota(fraction("r2", "h", eh, 1, 100), 3, limits))
	usageIs(t, s, 2100, map[string]int64{h100: 100, "A100-80GB": 2000})
}

func quotaCounters(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	e1 := register(t, s, node("n1", 2))
	e2 := register(t, s, node("n2", 2))
	reserve(t, s, placement("r1", "n1", e1, 0))
	reserve(t, s, fraction("r2", "n1", e1, 1, 500))
	usageIs(t, s, 1500, map[string]int64{h100: 1500})
	if ok, err := s.Release(ctx, "r1"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if ok, err := s.Release(ctx, "r1"); err != nil || ok {
		t.Fatalf("second release = %v, %v", ok, err)
	}
	usageIs(t, s, 500, map[string]int64{h100: 500})
	// A hand-over: the previous run stops counting, its next attempt
	// counts, and releasing the previous run takes nothing away again.
	if _, err := s.HandOver(ctx, "r2", "n1"); err != nil {
		t.Fatal(err)
	}
	usageIs(t, s, 0, nil)
	reserve(t, s, fraction("r2", "n2", e2, 0, 500))
	usageIs(t, s, 500, map[string]int64{h100: 500})
	if got, err := s.ReleaseHandedOver(ctx, "n1", "r2"); err != nil || !got[0] {
		t.Fatalf("release the handed-over copy = %v, %v", got, err)
	}
	usageIs(t, s, 500, map[string]int64{h100: 500})
	reserve(t, s, placement("r3", "n2", e2, 1))
	if got, err := s.ReleaseOn(ctx, "n2", "r2", "r3", "r9"); err != nil || !got[0] || !got[1] || got[2] {
		t.Fatalf("ReleaseOn = %v, %v", got, err)
	}
	usageIs(t, s, 0, nil)
	// A fenced node's allocations count until they are released.
	reserve(t, s, placement("r4", "n1", e1, 0))
	if _, err := s.Fence(ctx, "n1", e1); err != nil {
		t.Fatal(err)
	}
	usageIs(t, s, 1000, map[string]int64{h100: 1000})
	if got, err := s.ReleaseOn(ctx, "n1", "r4"); err != nil || !got[0] {
		t.Fatalf("ReleaseOn the fenced node = %v, %v", got, err)
	}
	usageIs(t, s, 0, nil)
}

func quotaRestore(t *testing.T, s capacity.Interface) {
	ctx := t.Context()
	e2 := register(t, s, node("n2", 1))
	reserve(t, s, attemptOf(placement("r1", "n2", e2, 0), 1))
	usageIs(t, s, 1000, map[string]int64{h100: 1000})
	// n1 comes back with r1 at a later attempt (it overtakes n2's copy)
	// and r2, a fraction: each counts once.
	in := capacity.RestoreInput{Node: modelNode("n1", 2, "A100-80GB"), Epoch: 2, Placements: []capacity.Placement{
		attemptOf(placement("r1", "n1", 2, 0), 2), fraction("r2", "n1", 2, 1, 250)}}
	res, err := s.Restore(ctx, in)
	if err != nil || !res.Restored {
		t.Fatalf("restore = %+v, %v", res, err)
	}
	usageIs(t, s, 1250, map[string]int64{"A100-80GB": 1250})
	// The same restore again (its reply lost) adds nothing.
	if _, err := s.Restore(ctx, in); err != nil {
		t.Fatal(err)
	}
	usageIs(t, s, 1250, map[string]int64{"A100-80GB": 1250})
	_, err = s.Reserve(ctx, withQuota(fraction("r3", "n2", e2, 0, 1000), 3, map[string]int64{"A100-80GB": 1}))
	if err != nil {
		t.Fatalf("reserve within quota after a restore: %v", err)
	}
	_, err = s.Reserve(ctx, withQuota(fraction("r4", "n2", e2, 0, 1), 2, nil))
	overQuota(t, err, "", 2, 2250, 1)
}

func quotaInvalid(t *testing.T, s capacity.Interface) {
	e1 := register(t, s, node("n1", 1))
	for name, q := range map[string]*capacity.Quota{
		"a negative total":     {MaxGPUs: -1},
		"a negative model cap": {MaxGPUs: 1, PerModel: map[string]int64{h100: -2}},
		"a model with a space": {MaxGPUs: 1, PerModel: map[string]int64{"H 100": 1}},
		"an empty model":       {MaxGPUs: 1, PerModel: map[string]int64{"": 1}},
	} {
		p := placement("r1", "n1", e1, 0)
		p.Quota = q
		if _, err := s.Reserve(t.Context(), p); !capacity.IsInvalid(err) {
			t.Errorf("%s: reserve = %v; want invalid", name, err)
		}
	}
	usageIs(t, s, 0, nil)
	if _, err := s.Usage(t.Context(), ""); !capacity.IsInvalid(err) {
		t.Errorf("usage of no tenant = %v; want invalid", err)
	}
}
