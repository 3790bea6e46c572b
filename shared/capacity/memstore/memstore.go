// Package memstore is a capacity store in memory: the same promises as the
// Redis store (capacity.Store), kept by one mutex instead of Lua scripts,
// for tests and single-process tools. It passes the capacity contract
// suite (capacitytest) and is the model of the capacity property test.
package memstore

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Store is an in-memory capacity store, safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	now     func() time.Time
	version uint64
	nodes   map[string]*node
	// index is each rental's live allocation: the very record its node
	// holds, unless the node's copy was handed over.
	index map[string]*capacity.Allocation
	// models is the GPU model of each share of the allocations, as their
	// tenants' usage counts them (capacity's quota.go).
	models map[*capacity.Allocation][]string
	// generation is the store's generation id, "" until the first
	// registration or restore (capacity.Store.Generation).
	generation string
}

type node struct {
	spec    capacity.Node
	specKey string
	status  capacity.NodeStatus
	epoch   uint64
	health  map[int]capacity.GPUHealth
	allocs  map[string]*capacity.Allocation
}

// New returns an empty store; allocations are stamped with time.Now.
func New() *Store {
	return &Store{now: time.Now, nodes: map[string]*node{}, index: map[string]*capacity.Allocation{},
		models: map[*capacity.Allocation][]string{}}
}

var _ capacity.Interface = (*Store)(nil)

func fail(op string, kind error, format string, args ...any) error {
	return fmt.Errorf("capacity: %s: %w: %s", op, kind, fmt.Sprintf(format, args...))
}

func invalid(op string, err error) error { return fmt.Errorf("capacity: %s: %w", op, err) }

func checkEpoch(op, field string, epoch uint64) error {
	if epoch == 0 {
		return fail(op, capacity.ErrInvalid, "%s: must be >= 1, got 0", field)
	}
	return nil
}

// free is what a node has free: its totals minus every allocation it
// holds (live or handed over).
type free struct {
	cpu, mem      int64
	milli, vram   []int64
	sharers       []int
	held          map[string]string // "<gpu>/<instance uuid>" -> rental
	instanceOf    map[string]string // "<gpu>/<instance uuid>" -> profile
	maxSharers    []int
	migMode       []bool
	instanceOrder [][]string
}

func freeOf(spec capacity.Node, allocs map[string]*capacity.Allocation) free {
	f := free{cpu: spec.CPUMilli, mem: spec.MemoryMiB, held: map[string]string{}, instanceOf: map[string]string{}}
	for _, g := range spec.GPUs {
		f.milli = append(f.milli, capacity.MilliPerGPU)
		f.vram = append(f.vram, g.VRAMMiB)
		f.sharers = append(f.sharers, 0)
		f.maxSharers = append(f.maxSharers, g.EffectiveMaxSharers())
		f.migMode = append(f.migMode, g.MIGEnabled)
		var uuids []string
		for _, m := range g.MIGInstances {
			f.instanceOf[instanceKey(g.Index, m.UUID)] = m.Profile
			uuids = append(uuids, m.UUID)
		}
		f.instanceOrder = append(f.instanceOrder, uuids)
	}
	for _, id := range slices.Sorted(maps.Keys(allocs)) {
		a := allocs[id]
		f.cpu -= a.CPUMilli
		f.mem -= a.MemoryMiB
		for _, g := range a.GPUs {
			if g.Index >= len(f.milli) {
				continue
			}
			f.milli[g.Index] -= g.Milli
			f.vram[g.Index] -= g.VRAMMiB
			f.sharers[g.Index]++
			if g.MIGInstance != "" {
				f.held[instanceKey(g.Index, g.MIGInstance)] = a.RentalID
			}
		}
	}
	return f
}

func instanceKey(gpu int, uuid string) string { return fmt.Sprintf("%d/%s", gpu, uuid) }

// misfit says why the live allocations do not fit spec ("" when they do),
// in the order the Redis store checks.
func misfit(spec capacity.Node, allocs map[string]*capacity.Allocation) string {
	n := len(spec.GPUs)
	inst := map[string]string{}
	for _, g := range spec.GPUs {
		for _, m := range g.MIGInstances {
			inst[instanceKey(g.Index, m.UUID)] = ""
		}
	}
	for _, id := range slices.Sorted(maps.Keys(allocs)) {
		a := allocs[id]
		for _, g := range a.GPUs {
			i := g.Index
			switch {
			case i >= n:
				return fmt.Sprintf("rental %s uses GPU %d but the node now has %d GPUs", a.RentalID, i, n)
			case g.MIGProfile != "" && !spec.GPUs[i].MIGEnabled:
				return fmt.Sprintf("rental %s holds MIG slice %s on GPU %d, which is no longer in MIG mode", a.RentalID, g.MIGProfile, i)
			case g.MIGProfile == "" && spec.GPUs[i].MIGEnabled:
				return fmt.Sprintf("rental %s time-shares GPU %d, which is now in MIG mode", a.RentalID, i)
			}
			if g.MIGInstance != "" {
				k := instanceKey(i, g.MIGInstance)
				if holder, ok := inst[k]; !ok || holder != "" {
					return fmt.Sprintf("rental %s holds MIG instance %s on GPU %d, which no longer has it", a.RentalID, g.MIGInstance, i)
				}
				inst[k] = a.RentalID
			}
		}
	}
	f := freeOf(spec, allocs)
	if f.cpu < 0 {
		return fmt.Sprintf("the host would have %d %s free", f.cpu, capacity.ResourceCPU)
	}
	if f.mem < 0 {
		return fmt.Sprintf("the host would have %d %s free", f.mem, capacity.ResourceMemory)
	}
	for i := range f.milli {
		switch {
		case f.milli[i] < 0:
			return fmt.Sprintf("GPU %d would have %d %s free", i, f.milli[i], capacity.ResourceMilliGPU)
		case f.vram[i] < 0:
			return fmt.Sprintf("GPU %d would have %d %s free", i, f.vram[i], capacity.ResourceVRAM)
		case f.sharers[i] > f.maxSharers[i]:
			return fmt.Sprintf("GPU %d would have %d %s free", i, f.maxSharers[i]-f.sharers[i], capacity.ResourceSharers)
		}
	}
	return ""
}

// Register records a node as capacity.Store.Register does.
func (s *Store) Register(ctx context.Context, n capacity.Node) (uint64, error) {
	reg, err := s.Join(ctx, n)
	return reg.Epoch, err
}

// Join is Register that also returns the store's generation, as
// capacity.Store.Join.
func (s *Store) Join(_ context.Context, n capacity.Node) (capacity.Registration, error) {
	op := "register node " + n.ID
	if err := n.Validate(); err != nil {
		return capacity.Registration{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ensureGeneration()
	epoch, err := s.register(op, n)
	return capacity.Registration{Epoch: epoch, Generation: s.generation}, err
}

// register is Register's step, with s.mu held.
func (s *Store) register(op string, n capacity.Node) (uint64, error) {
	spec := cloneNode(n)
	key, err := json.Marshal(spec)
	if err != nil {
		return 0, invalid(op, err)
	}
	cur, ok := s.nodes[n.ID]
	if !ok {
		s.nodes[n.ID] = &node{spec: spec, specKey: string(key), status: capacity.StatusReady, epoch: 1,
			health: map[int]capacity.GPUHealth{}, allocs: map[string]*capacity.Allocation{}}
		s.version++
		return 1, nil
	}
	if cur.status != capacity.StatusDead && cur.specKey == string(key) {
		return cur.epoch, nil
	}
	if why := misfit(spec, cur.allocs); why != "" {
		return 0, fail(op, capacity.ErrConflict, "live allocations do not fit the new facts (%s); release them first", why)
	}
	cur.spec, cur.specKey = spec, string(key)
	if cur.status == capacity.StatusDead {
		cur.status = capacity.StatusReady
	}
	for i := range cur.health {
		if i >= len(spec.GPUs) {
			delete(cur.health, i)
		}
	}
	s.version++
	return cur.epoch, nil
}

// Reserve commits a placement as capacity.Store.Reserve does: all or
// nothing, idempotent per rental id, fenced by the node's epoch.
func (s *Store) Reserve(_ context.Context, p capacity.Placement) (capacity.Allocation, error) {
	op := fmt.Sprintf("reserve rental %s on node %s", p.RentalID, p.NodeID)
	if err := p.Validate(); err != nil {
		return capacity.Allocation{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reserve(op, p)
}

func (s *Store) reserve(op string, p capacity.Placement) (capacity.Allocation, error) {
	if a, ok := s.index[p.RentalID]; ok {
		out := cloneAllocation(*a)
		out.Existing = true
		return out, nil
	}
	n, ok := s.nodes[p.NodeID]
	switch {
	case !ok:
		return capacity.Allocation{}, fail(op, capacity.ErrNotFound, "no such node")
	case n.allocs[p.RentalID] != nil:
		return capacity.Allocation{}, fail(op, capacity.ErrConflict, "the node still holds the rental's previous run")
	case n.status == capacity.StatusDead:
		return capacity.Allocation{}, fail(op, capacity.ErrFenced, "node is dead at epoch %d", n.epoch)
	case n.epoch != p.Epoch:
		return capacity.Allocation{}, fail(op, capacity.ErrFenced, "node is at epoch %d, placement saw %d", n.epoch, p.Epoch)
	case n.status != capacity.StatusReady:
		return capacity.Allocation{}, fail(op, capacity.ErrConflict, "node is %s", n.status)
	}
	models := modelsOn(n.spec, p)
	if err := s.checkQuota(op, p, models); err != nil {
		return capacity.Allocation{}, err
	}
	f := freeOf(n.spec, n.allocs)
	short := func(gpu int, res string, free, want int64) (capacity.Allocation, error) {
		return capacity.Allocation{}, fmt.Errorf("capacity: %s: %w", op, &capacity.InsufficientError{
			Node: p.NodeID, GPU: gpu, Resource: res, Free: free, Want: want})
	}
	if f.cpu < p.CPUMilli {
		return short(-1, capacity.ResourceCPU, f.cpu, p.CPUMilli)
	}
	if f.mem < p.MemoryMiB {
		return short(-1, capacity.ResourceMemory, f.mem, p.MemoryMiB)
	}
	for _, g := range p.GPUs {
		i := g.Index
		if i >= len(n.spec.GPUs) {
			return capacity.Allocation{}, fail(op, capacity.ErrInvalid, "node has %d GPUs, placement names GPU %d", len(n.spec.GPUs), i)
		}
		if h, marked := n.health[i]; marked {
			return capacity.Allocation{}, fail(op, capacity.ErrConflict, "GPU %d is %s", i, h)
		}
		k := instanceKey(i, g.MIGInstance)
		if g.MIGProfile != "" {
			profile, has := f.instanceOf[k]
			switch {
			case !f.migMode[i]:
				return capacity.Allocation{}, fail(op, capacity.ErrConflict, "GPU %d is not in MIG mode", i)
			case !has:
				return capacity.Allocation{}, fail(op, capacity.ErrConflict, "GPU %d has no MIG instance %s", i, g.MIGInstance)
			case profile != g.MIGProfile:
				return capacity.Allocation{}, fail(op, capacity.ErrConflict, "GPU %d's MIG instance %s is a %s, not the share's profile", i, g.MIGInstance, profile)
			case f.held[k] != "":
				return short(i, capacity.ResourceMIGInstance, 0, 1)
			}
		} else if f.migMode[i] {
			return capacity.Allocation{}, fail(op, capacity.ErrConflict, "GPU %d is in MIG mode and takes only MIG shares", i)
		}
		switch {
		case f.milli[i] < g.Milli:
			return short(i, capacity.ResourceMilliGPU, f.milli[i], g.Milli)
		case f.vram[i] < g.VRAMMiB:
			return short(i, capacity.ResourceVRAM, f.vram[i], g.VRAMMiB)
		case f.sharers[i] >= f.maxSharers[i]:
			return short(i, capacity.ResourceSharers, int64(f.maxSharers[i]-f.sharers[i]), 1)
		}
	}
	a := &capacity.Allocation{Placement: p, CreatedAt: s.now().UTC().Round(0)}
	a.GPUs = slices.Clone(p.GPUs)
	a.Quota = nil
	n.allocs[p.RentalID] = a
	s.index[p.RentalID] = a
	s.models[a] = models
	s.version++
	return cloneAllocation(*a), nil
}

// ReserveMany commits each placement in order, as Reserve would.
func (s *Store) ReserveMany(ctx context.Context, ps []capacity.Placement) []capacity.ReserveResult {
	out := make([]capacity.ReserveResult, len(ps))
	for i, p := range ps {
		out[i].Allocation, out[i].Err = s.Reserve(ctx, p)
	}
	return out
}

// Release gives a rental's live allocation back; false when it has none.
func (s *Store) Release(_ context.Context, rentalID string) (bool, error) {
	op := "release rental " + rentalID
	if err := capacity.CheckID("rentalID", rentalID); err != nil {
		return false, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.index[rentalID]
	if !ok {
		return false, nil
	}
	if n, ok := s.nodes[a.NodeID]; ok && n.allocs[rentalID] == a {
		delete(n.allocs, rentalID)
	}
	delete(s.index, rentalID)
	delete(s.models, a)
	s.version++
	return true, nil
}

// ReleaseOn gives back what nodeID holds of rentalIDs, live or handed over.
func (s *Store) ReleaseOn(_ context.Context, nodeID string, rentalIDs ...string) ([]bool, error) {
	return s.releaseOn(nodeID, false, rentalIDs)
}

// ReleaseHandedOver gives back the handed-over copies nodeID holds of
// rentalIDs.
func (s *Store) ReleaseHandedOver(_ context.Context, nodeID string, rentalIDs ...string) ([]bool, error) {
	return s.releaseOn(nodeID, true, rentalIDs)
}

func (s *Store) releaseOn(nodeID string, handedOverOnly bool, rentalIDs []string) ([]bool, error) {
	op := fmt.Sprintf("release %d rentals on node %s", len(rentalIDs), nodeID)
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return nil, invalid(op, err)
	}
	for _, id := range rentalIDs {
		if err := capacity.CheckID("rentalID", id); err != nil {
			return nil, invalid(op, err)
		}
	}
	if len(rentalIDs) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]bool, len(rentalIDs))
	for i, id := range rentalIDs {
		var rec *capacity.Allocation
		n := s.nodes[nodeID]
		if n != nil {
			rec = n.allocs[id]
		}
		switch {
		case handedOverOnly && (rec == nil || !rec.HandingOver):
			continue
		case rec == nil:
			// An index entry naming this node without its record: drop it.
			if idx, ok := s.index[id]; ok && idx.NodeID == nodeID {
				delete(s.index, id)
				delete(s.models, idx)
				s.version++
				out[i] = true
			}
			continue
		}
		delete(n.allocs, id)
		if s.index[id] == rec {
			delete(s.index, id)
		}
		delete(s.models, rec)
		s.version++
		out[i] = true
	}
	return out, nil
}

// HandOver marks the rental's allocation on nodeID as its previous run's,
// as capacity.Store.HandOver does.
func (s *Store) HandOver(_ context.Context, rentalID, nodeID string) (capacity.Allocation, error) {
	op := fmt.Sprintf("hand over rental %s on node %s", rentalID, nodeID)
	if err := checkIDs(rentalID, nodeID); err != nil {
		return capacity.Allocation{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	var rec *capacity.Allocation
	if n != nil {
		rec = n.allocs[rentalID]
	}
	switch {
	case rec == nil:
		return capacity.Allocation{}, fail(op, capacity.ErrNotFound, "the node holds no allocation of the rental")
	case rec.HandingOver:
		return cloneAllocation(*rec), nil
	case s.index[rentalID] != rec:
		return capacity.Allocation{}, fail(op, capacity.ErrConflict, "the rental's live allocation is another")
	}
	out := cloneAllocation(*rec)
	out.HandingOver = true
	n.allocs[rentalID] = &out
	delete(s.index, rentalID)
	delete(s.models, rec)
	s.version++
	return cloneAllocation(out), nil
}

func checkIDs(rentalID, nodeID string) error {
	if err := capacity.CheckID("rentalID", rentalID); err != nil {
		return err
	}
	return capacity.CheckID("nodeID", nodeID)
}

// Renew checks that nodeID still holds rentalID under epoch.
func (s *Store) Renew(_ context.Context, rentalID, nodeID string, epoch uint64) error {
	op := fmt.Sprintf("renew rental %s on node %s", rentalID, nodeID)
	if err := checkIDs(rentalID, nodeID); err != nil {
		return invalid(op, err)
	}
	if err := checkEpoch(op, "epoch", epoch); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	switch {
	case !ok:
		return fail(op, capacity.ErrNotFound, "no such node")
	case n.status == capacity.StatusDead:
		return fail(op, capacity.ErrFenced, "node is dead at epoch %d", n.epoch)
	case n.epoch != epoch:
		return fail(op, capacity.ErrFenced, "node is at epoch %d, agent holds %d", n.epoch, epoch)
	}
	a, ok := n.allocs[rentalID]
	switch {
	case !ok:
		return fail(op, capacity.ErrNotFound, "the node holds no such allocation")
	case a.Epoch != n.epoch:
		return fail(op, capacity.ErrFenced, "allocation was made at epoch %d, node is at %d", a.Epoch, n.epoch)
	}
	return nil
}

// Fence moves the node's epoch on and marks it dead, if it is still at
// expectedEpoch.
func (s *Store) Fence(_ context.Context, nodeID string, expectedEpoch uint64) (capacity.FenceResult, error) {
	op := fmt.Sprintf("fence node %s at epoch %d", nodeID, expectedEpoch)
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return capacity.FenceResult{}, invalid(op, err)
	}
	if err := checkEpoch(op, "expectedEpoch", expectedEpoch); err != nil {
		return capacity.FenceResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	switch {
	case !ok:
		return capacity.FenceResult{}, fail(op, capacity.ErrNotFound, "no such node")
	case n.epoch != expectedEpoch:
		return capacity.FenceResult{}, fail(op, capacity.ErrConflict, "node is at epoch %d", n.epoch)
	}
	n.epoch++
	n.status = capacity.StatusDead
	s.version++
	return capacity.FenceResult{Epoch: n.epoch, Allocations: sortedAllocations(n.allocs)}, nil
}

// SetStatus switches a live node between ready and draining.
func (s *Store) SetStatus(_ context.Context, nodeID string, status capacity.NodeStatus, expectedEpoch uint64) error {
	op := fmt.Sprintf("set node %s %s", nodeID, status)
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return invalid(op, err)
	}
	if status != capacity.StatusReady && status != capacity.StatusDraining {
		return fail(op, capacity.ErrInvalid, "status: must be %q or %q (use Fence to kill a node), got %q",
			capacity.StatusReady, capacity.StatusDraining, status)
	}
	if err := checkEpoch(op, "expectedEpoch", expectedEpoch); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	switch {
	case !ok:
		return fail(op, capacity.ErrNotFound, "no such node")
	case n.status == capacity.StatusDead:
		return fail(op, capacity.ErrFenced, "node is dead at epoch %d; it comes back by registering", n.epoch)
	case n.epoch != expectedEpoch:
		return fail(op, capacity.ErrConflict, "node is at epoch %d, caller expected %d", n.epoch, expectedEpoch)
	case n.status == status:
		return nil
	}
	n.status = status
	s.version++
	return nil
}

// SetGPUHealth records a GPU's health, as capacity.Store.SetGPUHealth does.
func (s *Store) SetGPUHealth(_ context.Context, nodeID string, epoch uint64, gpu int, h capacity.GPUHealth) (bool, error) {
	op := fmt.Sprintf("set GPU %d of node %s %s", gpu, nodeID, h)
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return false, invalid(op, err)
	}
	if err := checkEpoch(op, "epoch", epoch); err != nil {
		return false, err
	}
	if gpu < 0 || gpu >= capacity.MaxGPUsPerNode {
		return false, fail(op, capacity.ErrInvalid, "gpu: must be in 0..%d, got %d", capacity.MaxGPUsPerNode-1, gpu)
	}
	if h != capacity.HealthHealthy && h != capacity.HealthDegraded && h != capacity.HealthFailed {
		return false, fail(op, capacity.ErrInvalid, "health: must be %q, %q or %q, got %q",
			capacity.HealthHealthy, capacity.HealthDegraded, capacity.HealthFailed, h)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	switch {
	case !ok:
		return false, fail(op, capacity.ErrNotFound, "no such node")
	case n.status == capacity.StatusDead:
		return false, fail(op, capacity.ErrFenced, "node is dead at epoch %d", n.epoch)
	case n.epoch != epoch:
		return false, fail(op, capacity.ErrFenced, "node is at epoch %d, report is about %d", n.epoch, epoch)
	case gpu >= len(n.spec.GPUs):
		return false, fail(op, capacity.ErrInvalid, "node has %d GPUs", len(n.spec.GPUs))
	}
	cur, marked := n.health[gpu]
	if !marked {
		cur = capacity.HealthHealthy
	}
	if cur == h {
		return false, nil
	}
	if h == capacity.HealthHealthy {
		delete(n.health, gpu)
	} else {
		n.health[gpu] = h
	}
	s.version++
	return true, nil
}

// Remove forgets a node that holds no allocations.
func (s *Store) Remove(_ context.Context, nodeID string) error {
	op := "remove node " + nodeID
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	switch {
	case !ok:
		return fail(op, capacity.ErrNotFound, "no such node")
	case len(n.allocs) > 0:
		return fail(op, capacity.ErrConflict, "node still holds %d allocations", len(n.allocs))
	}
	delete(s.nodes, nodeID)
	s.version++
	return nil
}

// Node reads one node.
func (s *Store) Node(_ context.Context, nodeID string) (capacity.NodeState, error) {
	op := "read node " + nodeID
	if err := capacity.CheckID("nodeID", nodeID); err != nil {
		return capacity.NodeState{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	if !ok {
		return capacity.NodeState{}, fail(op, capacity.ErrNotFound, "no such node")
	}
	return stateOf(n), nil
}

// Allocations returns what a node holds, sorted by rental id.
func (s *Store) Allocations(ctx context.Context, nodeID string) ([]capacity.Allocation, error) {
	st, err := s.Node(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	return st.Allocations, nil
}

// Allocation returns a rental's live allocation.
func (s *Store) Allocation(_ context.Context, rentalID string) (capacity.Allocation, error) {
	op := "read rental " + rentalID
	if err := capacity.CheckID("rentalID", rentalID); err != nil {
		return capacity.Allocation{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.index[rentalID]
	if !ok {
		return capacity.Allocation{}, fmt.Errorf("capacity: %s: %w", op, capacity.ErrNotFound)
	}
	return cloneAllocation(*a), nil
}

// Version is the store-wide mutation counter.
func (s *Store) Version(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, nil
}

// Snapshot reads every node at once (always exact: one lock).
func (s *Store) Snapshot(context.Context) (capacity.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := capacity.Snapshot{Version: s.version, Nodes: make([]capacity.NodeState, 0, len(s.nodes))}
	for _, id := range slices.Sorted(maps.Keys(s.nodes)) {
		snap.Nodes = append(snap.Nodes, stateOf(s.nodes[id]))
	}
	return snap, nil
}

func stateOf(n *node) capacity.NodeState {
	f := freeOf(n.spec, n.allocs)
	st := capacity.NodeState{Node: cloneNode(n.spec), Status: n.status, Epoch: n.epoch,
		FreeCPUMilli: f.cpu, FreeMemoryMiB: f.mem, FreeGPUs: make([]capacity.FreeGPU, len(n.spec.GPUs)),
		Allocations: sortedAllocations(n.allocs)}
	for i := range n.spec.GPUs {
		g := capacity.FreeGPU{Index: i, Milli: f.milli[i], VRAMMiB: f.vram[i], Sharers: f.sharers[i],
			MaxSharers: f.maxSharers[i], Health: n.health[i]}
		for _, uuid := range f.instanceOrder[i] {
			if f.held[instanceKey(i, uuid)] == "" {
				g.FreeMIGInstances = append(g.FreeMIGInstances, uuid)
			}
		}
		slices.Sort(g.FreeMIGInstances)
		st.FreeGPUs[i] = g
	}
	return st
}

func sortedAllocations(allocs map[string]*capacity.Allocation) []capacity.Allocation {
	out := make([]capacity.Allocation, 0, len(allocs))
	for _, id := range slices.Sorted(maps.Keys(allocs)) {
		out = append(out, cloneAllocation(*allocs[id]))
	}
	return out
}

func cloneAllocation(a capacity.Allocation) capacity.Allocation {
	a.GPUs = slices.Clone(a.GPUs)
	return a
}

func cloneNode(n capacity.Node) capacity.Node {
	n.GPUs = slices.Clone(n.GPUs)
	for i := range n.GPUs {
		n.GPUs[i].NVLinkPeers = slices.Clone(n.GPUs[i].NVLinkPeers)
		n.GPUs[i].MIGInstances = slices.Clone(n.GPUs[i].MIGInstances)
	}
	if n.NVLinkDomains != nil {
		n.NVLinkDomains = slices.Clone(n.NVLinkDomains)
		for i := range n.NVLinkDomains {
			n.NVLinkDomains[i] = slices.Clone(n.NVLinkDomains[i])
		}
	}
	n.Labels = maps.Clone(n.Labels)
	return n
}

// modelsOn is the GPU model of each share of p on a node of spec.
func modelsOn(spec capacity.Node, p capacity.Placement) []string {
	out := make([]string, len(p.GPUs))
	for k, g := range p.GPUs {
		if g.Index < len(spec.GPUs) {
			out[k] = spec.GPUs[g.Index].Model
		}
	}
	return out
}

// usageOf is what tenant's live (indexed) allocations hold; call with
// s.mu held.
func (s *Store) usageOf(tenant string) capacity.Usage {
	u := capacity.Usage{PerModel: map[string]int64{}}
	for _, a := range s.index {
		if a.Tenant != tenant {
			continue
		}
		models := s.models[a]
		for k, g := range a.GPUs {
			u.MilliGPU += g.Milli
			if k < len(models) && models[k] != "" {
				u.PerModel[models[k]] += g.Milli
			}
		}
	}
	return u
}

// checkQuota refuses p, with shares of models, when it would take its
// tenant past p.Quota, as the Redis store's reserve does; call with s.mu
// held.
func (s *Store) checkQuota(op string, p capacity.Placement, models []string) error {
	if p.Quota == nil {
		return nil
	}
	u := s.usageOf(p.Tenant)
	var want int64
	wantm := map[string]int64{}
	for k, g := range p.GPUs {
		want += g.Milli
		if models[k] != "" {
			wantm[models[k]] += g.Milli
		}
	}
	over := func(model string, limit, used, w int64) error {
		return fmt.Errorf("capacity: %s: %w", op, &capacity.QuotaError{Tenant: p.Tenant, Model: model, Limit: limit, Used: used, Want: w})
	}
	if u.MilliGPU+want > p.Quota.MaxGPUs*capacity.MilliPerGPU {
		return over("", p.Quota.MaxGPUs, u.MilliGPU, want)
	}
	for _, m := range slices.Sorted(maps.Keys(p.Quota.PerModel)) {
		if w, ok := wantm[m]; ok && u.PerModel[m]+w > p.Quota.PerModel[m]*capacity.MilliPerGPU {
			return over(m, p.Quota.PerModel[m], u.PerModel[m], w)
		}
	}
	return nil
}

// Usage reads what tenant holds now, as capacity.Store.Usage.
func (s *Store) Usage(_ context.Context, tenant string) (capacity.Usage, error) {
	if tenant == "" {
		return capacity.Usage{}, fail("read usage", capacity.ErrInvalid, "tenant: must not be empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usageOf(tenant), nil
}
