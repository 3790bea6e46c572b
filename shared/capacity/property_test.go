package capacity_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/capacity/memstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// The property test drives the Redis store and its model, the in-memory
// store (memstore), with the same random steps and requires the same
// answers and the same state after every step. memstore states the
// store's promises in plain Go; the contract suite (capacitytest) checks
// both against the examples that matter most.

// sameOutcome says whether two answers to the same call agree: both
// succeeded, or both failed with the same kind of error, and an
// insufficient-capacity answer names the same GPU, resource and amounts.
func sameOutcome(got, want error) error {
	if (got == nil) != (want == nil) {
		return fmt.Errorf("store says %s, model %s", errText(got), errText(want))
	}
	if got == nil {
		return nil
	}
	var gq, wq *capacity.QuotaError
	if errors.As(want, &wq) {
		if !errors.As(got, &gq) || *gq != *wq {
			return fmt.Errorf("store says %s, model %s", errText(got), errText(want))
		}
		return nil
	}
	var gi, wi *capacity.InsufficientError
	if errors.As(want, &wi) {
		if !errors.As(got, &gi) || *gi != *wi {
			return fmt.Errorf("store says %s, model %s", errText(got), errText(want))
		}
		return nil
	}
	for _, kind := range []error{capacity.ErrNotFound, capacity.ErrConflict, capacity.ErrFenced, capacity.ErrInvalid, capacity.ErrInsufficient} {
		if errors.Is(want, kind) {
			if !errors.Is(got, kind) {
				return fmt.Errorf("store says %s, model %s", errText(got), errText(want))
			}
			return nil
		}
	}
	return fmt.Errorf("model answered an error of no kind: %w", want)
}

// placements drops what only one store can know (creation times).
func placements(allocs []capacity.Allocation) []capacity.Allocation {
	out := []capacity.Allocation{}
	for _, a := range allocs {
		out = append(out, capacity.Allocation{Placement: a.Placement, HandingOver: a.HandingOver, Existing: a.Existing})
	}
	return out
}

// nodeVariant is one of a few shapes a node's agent may report, so that
// re-registering changes GPUs, VRAM, sharer limits, MIG and host size.
func nodeVariant(id string, v int) capacity.Node {
	switch v {
	case 1: // one sharer on GPU 0; less VRAM and two sharers on GPU 1
		n := gpuNode(id, 2)
		n.GPUs[0].MaxSharers = 1
		n.GPUs[1].VRAMMiB = 40 * 1024
		n.GPUs[1].MaxSharers = 2
		return n
	case 2: // a third GPU, not MIG-capable, of another model
		n := gpuNode(id, 3)
		n.GPUs[2].MIGCapable = false
		n.GPUs[2].Model = "L4-24GB"
		return n
	case 3: // a single GPU on a small host
		n := gpuNode(id, 1)
		n.CPUMilli, n.MemoryMiB = 16_000, 64*1024
		return n
	case 4: // GPU 1 in MIG mode with two 1g.10gb instances
		n := gpuNode(id, 2)
		n.GPUs[1].MIGEnabled = true
		n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-" + id + "-1a", Profile: "1g.10gb", VRAMMiB: 9856},
			{UUID: "MIG-" + id + "-1b", Profile: "1g.10gb", VRAMMiB: 9856}}
		return n
	case 5: // GPU 1 in MIG mode, repartitioned: one instance kept, one new
		n := gpuNode(id, 2)
		n.GPUs[1].MIGEnabled = true
		n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-" + id + "-1a", Profile: "1g.10gb", VRAMMiB: 9856},
			{UUID: "MIG-" + id + "-1c", Profile: "2g.20gb", VRAMMiB: 19968}}
		return n
	}
	return gpuNode(id, 2)
}

var (
	propNodes   = []string{"n0", "n1", "n2"}
	propRentals = []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"}
	propTenants = []string{"acme", "globex"}
)

func TestStoreMatchesModel(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	ctx := t.Context()
	var run atomic.Int64

	rapid.Check(t, func(rt *rapid.T) {
		s, err := capacity.New(rdb, capacity.WithPrefix(fmt.Sprintf("prop:%d", run.Add(1))), capacity.WithSnapshotBatch(2))
		if err != nil {
			rt.Fatal(err)
		}
		m := memstore.New()

		// epochFor draws the node's current epoch most of the time, else any.
		epochFor := func(rt *rapid.T, nodeID string) uint64 {
			if st, err := m.Node(ctx, nodeID); err == nil && rapid.IntRange(0, 3).Draw(rt, "stale") > 0 {
				return st.Epoch
			}
			return rapid.Uint64Range(1, 4).Draw(rt, "epoch")
		}
		// same fails the run when the store and the model disagree.
		same := func(rt *rapid.T, what string, got, want any, gotErr, wantErr error) {
			if err := sameOutcome(gotErr, wantErr); err != nil {
				rt.Fatalf("%s: %v", what, err)
			}
			if gotErr == nil && !reflect.DeepEqual(got, want) {
				rt.Fatalf("%s:\n store %+v\n model %+v", what, got, want)
			}
		}
		rental := func(rt *rapid.T) string { return rapid.SampledFrom(propRentals).Draw(rt, "rental") }
		nodeOf := func(rt *rapid.T) string { return rapid.SampledFrom(propNodes).Draw(rt, "node") }

		reserve := func(rt *rapid.T, nodeID string, epoch uint64) {
			p := capacity.Placement{
				RentalID:  rental(rt),
				NodeID:    nodeID,
				Epoch:     epoch,
				Tenant:    rapid.SampledFrom(propTenants).Draw(rt, "tenant"),
				CPUMilli:  rapid.Int64Range(0, 20_000).Draw(rt, "cpu"),
				MemoryMiB: rapid.Int64Range(0, 200*1024).Draw(rt, "mem"),
			}
			indexes := rapid.SliceOfNDistinct(rapid.IntRange(0, 3), 1, 2, rapid.ID[int]).Draw(rt, "gpus")
			for _, i := range indexes {
				g := capacity.GPUShare{
					Index:   i,
					Milli:   rapid.OneOf(rapid.SampledFrom([]int64{1, 100, 250, 500, 1000}), rapid.Int64Range(1, 1000)).Draw(rt, "milli"),
					VRAMMiB: rapid.Int64Range(0, 50*1024).Draw(rt, "vram"),
				}
				if rapid.IntRange(0, 3).Draw(rt, "mig") == 0 {
					g.MIGProfile = rapid.SampledFrom([]string{"1g.10gb", "2g.20gb"}).Draw(rt, "profile")
					g.MIGInstance = "MIG-" + nodeID + "-" + rapid.SampledFrom([]string{"1a", "1b", "1c", "0a"}).Draw(rt, "instance")
				}
				p.GPUs = append(p.GPUs, g)
			}
			if rapid.IntRange(0, 2).Draw(rt, "with quota") == 0 {
				p.Quota = &capacity.Quota{MaxGPUs: rapid.Int64Range(0, 3).Draw(rt, "max gpus")}
				if rapid.Bool().Draw(rt, "model cap") {
					m := rapid.SampledFrom([]string{"H100-SXM-80GB", "L4-24GB"}).Draw(rt, "capped model")
					p.Quota.PerModel = map[string]int64{m: rapid.Int64Range(0, 2).Draw(rt, "model max")}
				}
			}
			a, err := s.Reserve(ctx, p)
			wa, werr := m.Reserve(ctx, p)
			same(rt, fmt.Sprintf("reserve %+v", p), placements([]capacity.Allocation{a}), placements([]capacity.Allocation{wa}), err, werr)
		}

		rt.Repeat(map[string]func(*rapid.T){
			"register": func(rt *rapid.T) {
				spec := nodeVariant(nodeOf(rt), rapid.IntRange(0, 5).Draw(rt, "variant"))
				epoch, err := s.Register(ctx, spec)
				wepoch, werr := m.Register(ctx, spec)
				same(rt, "register "+spec.ID, epoch, wepoch, err, werr)
			},
			"reserve": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				reserve(rt, nodeID, epochFor(rt, nodeID))
			},
			// The same action twice makes reserves twice as frequent, so GPUs
			// fill up and the VRAM and sharer limits are reached.
			"reserve again": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				reserve(rt, nodeID, epochFor(rt, nodeID))
			},
			"release": func(rt *rapid.T) {
				r := rental(rt)
				got, err := s.Release(ctx, r)
				want, werr := m.Release(ctx, r)
				same(rt, "release "+r, got, want, err, werr)
			},
			"hand over": func(rt *rapid.T) {
				r, nodeID := rental(rt), nodeOf(rt)
				if a, err := m.Allocation(ctx, r); err == nil && rapid.Bool().Draw(rt, "owner") {
					nodeID = a.NodeID
				}
				a, err := s.HandOver(ctx, r, nodeID)
				wa, werr := m.HandOver(ctx, r, nodeID)
				same(rt, "hand over "+r+" on "+nodeID, placements([]capacity.Allocation{a}), placements([]capacity.Allocation{wa}), err, werr)
			},
			"release on": func(rt *rapid.T) {
				nodeID, rs := nodeOf(rt), rapid.SliceOfNDistinct(rapid.SampledFrom(propRentals), 1, 3, rapid.ID[string]).Draw(rt, "rentals")
				handedOver := rapid.Bool().Draw(rt, "handed over only")
				var got, want []bool
				var err, werr error
				if handedOver {
					got, err = s.ReleaseHandedOver(ctx, nodeID, rs...)
					want, werr = m.ReleaseHandedOver(ctx, nodeID, rs...)
				} else {
					got, err = s.ReleaseOn(ctx, nodeID, rs...)
					want, werr = m.ReleaseOn(ctx, nodeID, rs...)
				}
				same(rt, fmt.Sprintf("release %v on %s (handed over only %v)", rs, nodeID, handedOver), got, want, err, werr)
			},
			"fence": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				epoch := epochFor(rt, nodeID)
				f, err := s.Fence(ctx, nodeID, epoch)
				wf, werr := m.Fence(ctx, nodeID, epoch)
				same(rt, fmt.Sprintf("fence %s at %d", nodeID, epoch), []any{f.Epoch, placements(f.Allocations)},
					[]any{wf.Epoch, placements(wf.Allocations)}, err, werr)
			},
			"renew": func(rt *rapid.T) {
				r, nodeID := rental(rt), nodeOf(rt)
				if a, err := m.Allocation(ctx, r); err == nil && rapid.Bool().Draw(rt, "owner") {
					nodeID = a.NodeID
				}
				epoch := epochFor(rt, nodeID)
				same(rt, fmt.Sprintf("renew %s on %s at %d", r, nodeID, epoch), nil, nil,
					s.Renew(ctx, r, nodeID, epoch), m.Renew(ctx, r, nodeID, epoch))
			},
			"set status": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				status := rapid.SampledFrom([]capacity.NodeStatus{capacity.StatusReady, capacity.StatusDraining}).Draw(rt, "status")
				epoch := epochFor(rt, nodeID)
				same(rt, fmt.Sprintf("set %s %s at %d", nodeID, status, epoch), nil, nil,
					s.SetStatus(ctx, nodeID, status, epoch), m.SetStatus(ctx, nodeID, status, epoch))
			},
			"set GPU health": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				epoch := epochFor(rt, nodeID)
				gpu := rapid.IntRange(0, 3).Draw(rt, "gpu")
				h := rapid.SampledFrom([]capacity.GPUHealth{capacity.HealthHealthy, capacity.HealthDegraded, capacity.HealthFailed}).Draw(rt, "health")
				got, err := s.SetGPUHealth(ctx, nodeID, epoch, gpu, h)
				want, werr := m.SetGPUHealth(ctx, nodeID, epoch, gpu, h)
				same(rt, fmt.Sprintf("set GPU %d of %s %s at %d", gpu, nodeID, h, epoch), got, want, err, werr)
			},
			"remove": func(rt *rapid.T) {
				nodeID := nodeOf(rt)
				same(rt, "remove "+nodeID, nil, nil, s.Remove(ctx, nodeID), m.Remove(ctx, nodeID))
			},
			"": func(rt *rapid.T) {
				snap, err := s.Snapshot(ctx)
				if err != nil {
					rt.Fatal(err)
				}
				want, _ := m.Snapshot(ctx)
				if snap.Version != want.Version {
					rt.Fatalf("store at version %d, model at %d", snap.Version, want.Version)
				}
				if len(snap.Nodes) != len(want.Nodes) {
					rt.Fatalf("store has %d nodes, model %d", len(snap.Nodes), len(want.Nodes))
				}
				for i, st := range snap.Nodes {
					if err := conserved(st); err != nil {
						rt.Fatal(err)
					}
					w := want.Nodes[i]
					got, exp := st, w
					got.Allocations, exp.Allocations = placements(st.Allocations), placements(w.Allocations)
					if !reflect.DeepEqual(got, exp) {
						rt.Fatalf("node %s:\n store %+v\n model %+v", st.ID, got, exp)
					}
				}
				for _, tenant := range propTenants {
					u, err := s.Usage(ctx, tenant)
					wu, werr := m.Usage(ctx, tenant)
					same(rt, "usage of "+tenant, u, wu, err, werr)
				}
				for _, r := range propRentals {
					a, err := s.Allocation(ctx, r)
					wa, werr := m.Allocation(ctx, r)
					same(rt, "rental "+r, placements([]capacity.Allocation{a}), placements([]capacity.Allocation{wa}), err, werr)
				}
			},
		})
	})
}

// errText is err's message, or "no error" for nil.
func errText(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
