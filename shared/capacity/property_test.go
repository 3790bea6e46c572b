package capacity_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// model is a plain in-memory statement of what the store promises. The
// property test drives the store and the model with the same random steps
// and requires the same answers and the same state after every step.
type model struct {
	nodes   map[string]*modelNode
	rentals map[string]string // rental -> node
}

type modelNode struct {
	spec   capacity.Node
	status capacity.NodeStatus
	epoch  uint64
	allocs map[string]capacity.Placement
}

// expected is the model's answer: a sentinel (nil for success), and for an
// insufficient-capacity answer the exact *InsufficientError.
type expected struct {
	err          error
	insufficient *capacity.InsufficientError
}

func (e expected) check(got error) error {
	if e.insufficient != nil {
		var ie *capacity.InsufficientError
		if !errors.As(got, &ie) || *ie != *e.insufficient {
			return fmt.Errorf("want %v, got %v", e.insufficient, got)
		}
		return nil
	}
	if (e.err == nil) != (got == nil) || !errors.Is(got, e.err) {
		return fmt.Errorf("want %v, got %v", e.err, got)
	}
	return nil
}

// free is what the model says a node has free: totals minus allocations.
type modelFree struct {
	cpu, mem      int64
	milli, vram   []int64
	sharers, max_ []int
}

func (n *modelNode) free() modelFree {
	f := modelFree{cpu: n.spec.CPUMilli, mem: n.spec.MemoryMiB}
	for _, g := range n.spec.GPUs {
		f.milli = append(f.milli, capacity.MilliPerGPU)
		f.vram = append(f.vram, g.VRAMMiB)
		f.sharers = append(f.sharers, 0)
		f.max_ = append(f.max_, g.EffectiveMaxSharers())
	}
	for _, a := range n.allocs {
		f.cpu -= a.CPUMilli
		f.mem -= a.MemoryMiB
		for _, g := range a.GPUs {
			if g.Index < len(f.milli) {
				f.milli[g.Index] -= g.Milli
				f.vram[g.Index] -= g.VRAMMiB
				f.sharers[g.Index]++
			}
		}
	}
	return f
}

// fits says whether the live allocations fit a node's new facts.
func (n *modelNode) fits(spec capacity.Node) bool {
	trial := &modelNode{spec: spec, allocs: n.allocs}
	held := map[string]bool{}
	for _, a := range n.allocs {
		for _, g := range a.GPUs {
			if g.Index >= len(spec.GPUs) || (g.MIGProfile != "") != spec.GPUs[g.Index].MIGEnabled {
				return false
			}
			if g.MIGInstance != "" && (held[g.MIGInstance] || !hasInstance(spec.GPUs[g.Index], g.MIGInstance)) {
				return false
			}
			held[g.MIGInstance] = true
		}
	}
	f := trial.free()
	if f.cpu < 0 || f.mem < 0 {
		return false
	}
	for i := range f.milli {
		if f.milli[i] < 0 || f.vram[i] < 0 || f.sharers[i] > f.max_[i] {
			return false
		}
	}
	return true
}

func (m *model) register(spec capacity.Node) (uint64, expected) {
	n, ok := m.nodes[spec.ID]
	if !ok {
		m.nodes[spec.ID] = &modelNode{spec: spec, status: capacity.StatusReady, epoch: 1, allocs: map[string]capacity.Placement{}}
		return 1, expected{}
	}
	if !n.fits(spec) {
		return 0, expected{err: capacity.ErrConflict}
	}
	n.spec = spec
	if n.status == capacity.StatusDead {
		n.status = capacity.StatusReady
	}
	return n.epoch, expected{}
}

// reserve returns the allocation's placement and whether it is an existing one.
func (m *model) reserve(p capacity.Placement) (capacity.Placement, bool, expected) {
	if nodeID, ok := m.rentals[p.RentalID]; ok {
		return m.nodes[nodeID].allocs[p.RentalID], true, expected{}
	}
	n, ok := m.nodes[p.NodeID]
	switch {
	case !ok:
		return p, false, expected{err: capacity.ErrNotFound}
	case n.status == capacity.StatusDead, n.epoch != p.Epoch:
		return p, false, expected{err: capacity.ErrFenced}
	case n.status != capacity.StatusReady:
		return p, false, expected{err: capacity.ErrConflict}
	}
	f := n.free()
	short := func(gpu int, res string, free, want int64) (capacity.Placement, bool, expected) {
		return p, false, expected{err: capacity.ErrInsufficient, insufficient: &capacity.InsufficientError{
			Node: p.NodeID, GPU: gpu, Resource: res, Free: free, Want: want,
		}}
	}
	if f.cpu < p.CPUMilli {
		return short(-1, capacity.ResourceCPU, f.cpu, p.CPUMilli)
	}
	if f.mem < p.MemoryMiB {
		return short(-1, capacity.ResourceMemory, f.mem, p.MemoryMiB)
	}
	held := map[string]bool{}
	for _, a := range n.allocs {
		for _, g := range a.GPUs {
			held[g.MIGInstance] = true
		}
	}
	for _, g := range p.GPUs {
		i := g.Index
		switch {
		case i >= len(n.spec.GPUs):
			return p, false, expected{err: capacity.ErrInvalid}
		case g.MIGProfile != "" && !n.spec.GPUs[i].MIGEnabled,
			g.MIGProfile != "" && !hasInstance(n.spec.GPUs[i], g.MIGInstance),
			g.MIGProfile == "" && n.spec.GPUs[i].MIGEnabled,
			g.MIGProfile != "" && instanceProfile(n.spec.GPUs[i], g.MIGInstance) != g.MIGProfile:
			return p, false, expected{err: capacity.ErrConflict}
		case g.MIGProfile != "" && held[g.MIGInstance]:
			return short(i, capacity.ResourceMIGInstance, 0, 1)
		case f.milli[i] < g.Milli:
			return short(i, capacity.ResourceMilliGPU, f.milli[i], g.Milli)
		case f.vram[i] < g.VRAMMiB:
			return short(i, capacity.ResourceVRAM, f.vram[i], g.VRAMMiB)
		case f.sharers[i] >= f.max_[i]:
			return short(i, capacity.ResourceSharers, int64(f.max_[i]-f.sharers[i]), 1)
		}
	}
	n.allocs[p.RentalID] = p
	m.rentals[p.RentalID] = p.NodeID
	return p, false, expected{}
}

func instanceProfile(g capacity.GPU, uuid string) string {
	for _, m := range g.MIGInstances {
		if m.UUID == uuid {
			return m.Profile
		}
	}
	return ""
}

func hasInstance(g capacity.GPU, uuid string) bool {
	for _, m := range g.MIGInstances {
		if m.UUID == uuid {
			return true
		}
	}
	return false
}

func (m *model) release(rental string) bool {
	nodeID, ok := m.rentals[rental]
	if ok {
		delete(m.nodes[nodeID].allocs, rental)
		delete(m.rentals, rental)
	}
	return ok
}

func (m *model) fence(nodeID string, epoch uint64) ([]capacity.Placement, expected) {
	n, ok := m.nodes[nodeID]
	switch {
	case !ok:
		return nil, expected{err: capacity.ErrNotFound}
	case n.epoch != epoch:
		return nil, expected{err: capacity.ErrConflict}
	}
	n.epoch++
	n.status = capacity.StatusDead
	return sortedPlacements(n.allocs), expected{}
}

func (m *model) renew(rental, nodeID string, epoch uint64) expected {
	n, ok := m.nodes[nodeID]
	if !ok {
		return expected{err: capacity.ErrNotFound}
	}
	if n.status == capacity.StatusDead || n.epoch != epoch {
		return expected{err: capacity.ErrFenced}
	}
	a, ok := n.allocs[rental]
	if !ok {
		return expected{err: capacity.ErrNotFound}
	}
	if a.Epoch != n.epoch {
		return expected{err: capacity.ErrFenced}
	}
	return expected{}
}

func (m *model) setStatus(nodeID string, status capacity.NodeStatus, epoch uint64) expected {
	n, ok := m.nodes[nodeID]
	switch {
	case !ok:
		return expected{err: capacity.ErrNotFound}
	case n.status == capacity.StatusDead:
		return expected{err: capacity.ErrFenced}
	case n.epoch != epoch:
		return expected{err: capacity.ErrConflict}
	}
	n.status = status
	return expected{}
}

func (m *model) remove(nodeID string) expected {
	n, ok := m.nodes[nodeID]
	switch {
	case !ok:
		return expected{err: capacity.ErrNotFound}
	case len(n.allocs) > 0:
		return expected{err: capacity.ErrConflict}
	}
	delete(m.nodes, nodeID)
	return expected{}
}

func sortedPlacements(allocs map[string]capacity.Placement) []capacity.Placement {
	out := []capacity.Placement{}
	for _, id := range slices.Sorted(maps.Keys(allocs)) {
		out = append(out, allocs[id])
	}
	return out
}

func placementsOf(allocs []capacity.Allocation) []capacity.Placement {
	out := []capacity.Placement{}
	for _, a := range allocs {
		out = append(out, a.Placement)
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
	case 2: // a third GPU, not MIG-capable
		n := gpuNode(id, 3)
		n.GPUs[2].MIGCapable = false
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
		m := &model{nodes: map[string]*modelNode{}, rentals: map[string]string{}}

		// epochFor draws the node's current epoch most of the time, else any.
		epochFor := func(rt *rapid.T, nodeID string) uint64 {
			if n, ok := m.nodes[nodeID]; ok && rapid.IntRange(0, 3).Draw(rt, "stale") > 0 {
				return n.epoch
			}
			return rapid.Uint64Range(1, 4).Draw(rt, "epoch")
		}

		reserve := func(rt *rapid.T, nodeID string, epoch uint64) {
			p := capacity.Placement{
				RentalID:  rapid.SampledFrom(propRentals).Draw(rt, "rental"),
				NodeID:    nodeID,
				Epoch:     epoch,
				Tenant:    "acme",
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
			wantPlacement, wantExisting, want := m.reserve(p)
			a, err := s.Reserve(ctx, p)
			if cerr := want.check(err); cerr != nil {
				rt.Fatalf("reserve %+v: %v", p, cerr)
			}
			if err == nil && (a.Existing != wantExisting || !reflect.DeepEqual(a.Placement, wantPlacement)) {
				rt.Fatalf("reserve %s: got %+v, want %+v (existing %v)", p.RentalID, a, wantPlacement, wantExisting)
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"register": func(rt *rapid.T) {
				spec := nodeVariant(rapid.SampledFrom(propNodes).Draw(rt, "node"), rapid.IntRange(0, 5).Draw(rt, "variant"))
				wantEpoch, want := m.register(spec)
				epoch, err := s.Register(ctx, spec)
				if cerr := want.check(err); cerr != nil {
					rt.Fatalf("register %s: %v", spec.ID, cerr)
				}
				if err == nil && epoch != wantEpoch {
					rt.Fatalf("register %s: epoch %d, want %d", spec.ID, epoch, wantEpoch)
				}
			},
			"reserve": func(rt *rapid.T) {
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				reserve(rt, nodeID, epochFor(rt, nodeID))
			},
			// The same action twice makes reserves twice as frequent, so GPUs
			// fill up and the VRAM and sharer limits are reached.
			"reserve again": func(rt *rapid.T) {
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				reserve(rt, nodeID, epochFor(rt, nodeID))
			},
			"release": func(rt *rapid.T) {
				rental := rapid.SampledFrom(propRentals).Draw(rt, "rental")
				want := m.release(rental)
				got, err := s.Release(ctx, rental)
				if err != nil || got != want {
					rt.Fatalf("release %s: %v, %v; want %v", rental, got, err, want)
				}
			},
			"fence": func(rt *rapid.T) {
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				epoch := epochFor(rt, nodeID)
				wantAllocs, want := m.fence(nodeID, epoch)
				f, err := s.Fence(ctx, nodeID, epoch)
				if cerr := want.check(err); cerr != nil {
					rt.Fatalf("fence %s at %d: %v", nodeID, epoch, cerr)
				}
				if err == nil && (f.Epoch != m.nodes[nodeID].epoch || !reflect.DeepEqual(placementsOf(f.Allocations), wantAllocs)) {
					rt.Fatalf("fence %s: got %+v, want epoch %d and %+v", nodeID, f, m.nodes[nodeID].epoch, wantAllocs)
				}
			},
			"renew": func(rt *rapid.T) {
				rental := rapid.SampledFrom(propRentals).Draw(rt, "rental")
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				if owner, ok := m.rentals[rental]; ok && rapid.Bool().Draw(rt, "owner") {
					nodeID = owner
				}
				epoch := epochFor(rt, nodeID)
				want := m.renew(rental, nodeID, epoch)
				if cerr := want.check(s.Renew(ctx, rental, nodeID, epoch)); cerr != nil {
					rt.Fatalf("renew %s on %s at %d: %v", rental, nodeID, epoch, cerr)
				}
			},
			"set status": func(rt *rapid.T) {
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				status := rapid.SampledFrom([]capacity.NodeStatus{capacity.StatusReady, capacity.StatusDraining}).Draw(rt, "status")
				epoch := epochFor(rt, nodeID)
				want := m.setStatus(nodeID, status, epoch)
				if cerr := want.check(s.SetStatus(ctx, nodeID, status, epoch)); cerr != nil {
					rt.Fatalf("set %s %s at %d: %v", nodeID, status, epoch, cerr)
				}
			},
			"remove": func(rt *rapid.T) {
				nodeID := rapid.SampledFrom(propNodes).Draw(rt, "node")
				want := m.remove(nodeID)
				if cerr := want.check(s.Remove(ctx, nodeID)); cerr != nil {
					rt.Fatalf("remove %s: %v", nodeID, cerr)
				}
			},
			"": func(rt *rapid.T) {
				snap, err := s.Snapshot(ctx)
				if err != nil {
					rt.Fatal(err)
				}
				if len(snap.Nodes) != len(m.nodes) {
					rt.Fatalf("store has %d nodes, model %d", len(snap.Nodes), len(m.nodes))
				}
				for _, st := range snap.Nodes {
					n := m.nodes[st.ID]
					if n == nil {
						rt.Fatalf("store has node %s, model does not", st.ID)
					}
					if err := conserved(st); err != nil {
						rt.Fatal(err)
					}
					if st.Status != n.status || st.Epoch != n.epoch || !reflect.DeepEqual(st.Node, n.spec) {
						rt.Fatalf("node %s: %s at %d, model %s at %d", st.ID, st.Status, st.Epoch, n.status, n.epoch)
					}
					if got, want := placementsOf(st.Allocations), sortedPlacements(n.allocs); !reflect.DeepEqual(got, want) {
						rt.Fatalf("node %s allocations:\n got %+v\nwant %+v", st.ID, got, want)
					}
					f := n.free()
					held := map[string]bool{}
					for _, a := range n.allocs {
						for _, g := range a.GPUs {
							held[g.MIGInstance] = true
						}
					}
					for i, g := range st.FreeGPUs {
						if g.Milli != f.milli[i] || g.VRAMMiB != f.vram[i] || g.Sharers != f.sharers[i] {
							rt.Fatalf("node %s GPU %d: %+v, model milli %d vram %d sharers %d", st.ID, i, g, f.milli[i], f.vram[i], f.sharers[i])
						}
						var free []string
						for _, m := range n.spec.GPUs[i].MIGInstances {
							if !held[m.UUID] {
								free = append(free, m.UUID)
							}
						}
						slices.Sort(free)
						if !slices.Equal(g.FreeMIGInstances, free) {
							rt.Fatalf("node %s GPU %d: free MIG instances %v, model %v", st.ID, i, g.FreeMIGInstances, free)
						}
					}
				}
				for _, rental := range propRentals {
					a, err := s.Allocation(ctx, rental)
					nodeID, ok := m.rentals[rental]
					switch {
					case !ok && !capacity.IsNotFound(err):
						rt.Fatalf("rental %s: model has none, store says %+v, %v", rental, a, err)
					case ok && (err != nil || a.NodeID != nodeID):
						rt.Fatalf("rental %s: model has it on %s, store says %+v, %v", rental, nodeID, a, err)
					}
				}
			},
		})
	})
}
