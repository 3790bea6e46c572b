// Package porttest holds hand-written recording fakes of the scheduler's
// ports and the contract suite of each port, which the real adapters pass
// against real Redis and NATS and the fakes pass too.
package porttest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Reserver is an in-memory ports.Reserver over nodes whose GPUs each hold
// 1000 milli-GPU. It records every call and can be told to refuse.
type Reserver struct {
	mu     sync.Mutex
	nodes  map[string]FakeNode
	allocs map[string]capacity.Allocation
	clock  time.Time

	// Reserved are the placements of each ReserveMany call, Released the
	// rentals of each Release call, in call order.
	Reserved [][]capacity.Placement
	Released []string
	// Refuse makes the reserve of a rental fail with that error (once).
	Refuse map[string]error
	// ReleaseErr makes every Release fail.
	ReleaseErr error
}

// FakeNode is a node of the fake Reserver.
type FakeNode struct {
	ID    string
	Epoch uint64
	GPUs  int
}

// NewReserver is a fake holding nodes, empty.
func NewReserver(nodes ...FakeNode) *Reserver {
	r := &Reserver{nodes: map[string]FakeNode{}, allocs: map[string]capacity.Allocation{},
		clock: time.Unix(1_700_000_000, 0), Refuse: map[string]error{}}
	for _, n := range nodes {
		r.nodes[n.ID] = n
	}
	return r
}

var _ ports.Reserver = (*Reserver)(nil)

// ReserveMany implements ports.Reserver.
func (r *Reserver) ReserveMany(_ context.Context, ps []capacity.Placement) []capacity.ReserveResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Reserved = append(r.Reserved, slices.Clone(ps))
	out := make([]capacity.ReserveResult, len(ps))
	for i, p := range ps {
		out[i].Allocation, out[i].Err = r.reserve(p)
	}
	return out
}

func (r *Reserver) reserve(p capacity.Placement) (capacity.Allocation, error) {
	if err, ok := r.Refuse[p.RentalID]; ok {
		delete(r.Refuse, p.RentalID)
		return capacity.Allocation{}, err
	}
	if a, ok := r.allocs[p.RentalID]; ok {
		a.Existing = true
		return a, nil
	}
	n, ok := r.nodes[p.NodeID]
	switch {
	case !ok:
		return capacity.Allocation{}, fmt.Errorf("fake reserver: node %s: %w", p.NodeID, capacity.ErrNotFound)
	case n.Epoch != p.Epoch:
		return capacity.Allocation{}, fmt.Errorf("fake reserver: node %s at epoch %d, placement saw %d: %w", p.NodeID, n.Epoch, p.Epoch, capacity.ErrFenced)
	}
	used := map[int]int64{}
	for _, a := range r.allocs {
		if a.NodeID == p.NodeID {
			for _, g := range a.GPUs {
				used[g.Index] += g.Milli
			}
		}
	}
	for _, g := range p.GPUs {
		if g.Index >= n.GPUs || used[g.Index]+g.Milli > 1000 {
			return capacity.Allocation{}, fmt.Errorf("fake reserver: GPU %d of %s: %w", g.Index, p.NodeID, capacity.ErrInsufficient)
		}
	}
	r.clock = r.clock.Add(time.Second)
	a := capacity.Allocation{Placement: p, CreatedAt: r.clock}
	a.GPUs = slices.Clone(p.GPUs)
	r.allocs[p.RentalID] = a
	return a, nil
}

// Release implements ports.Reserver.
func (r *Reserver) Release(_ context.Context, rental string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Released = append(r.Released, rental)
	if r.ReleaseErr != nil {
		return false, r.ReleaseErr
	}
	_, ok := r.allocs[rental]
	delete(r.allocs, rental)
	return ok, nil
}

// Allocation implements ports.Reserver.
func (r *Reserver) Allocation(_ context.Context, rental string) (capacity.Allocation, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.allocs[rental]
	if !ok {
		return capacity.Allocation{}, fmt.Errorf("fake reserver: rental %s: %w", rental, capacity.ErrNotFound)
	}
	return a, nil
}

// Records is an in-memory ports.OutcomeRecords. It records every claim and
// can be told to fail.
type Records struct {
	mu       sync.Mutex
	outcomes map[string]string // attempt key -> "outcome[ token]"
	classes  map[string]ports.Class
	pending  map[string]ports.PendingEntry
	preempt  map[string]ports.Preemption

	// Claims are the claims made, in call order.
	Claims []ClaimCall
	// Err makes every call fail.
	Err error
}

// ClaimCall is one Claim.
type ClaimCall struct {
	Keys   []string
	Want   string
	Allocs []string
}

// NewRecords is empty fake records.
func NewRecords() *Records {
	return &Records{outcomes: map[string]string{}, classes: map[string]ports.Class{}, pending: map[string]ports.PendingEntry{},
		preempt: map[string]ports.Preemption{}}
}

var _ ports.OutcomeRecords = (*Records)(nil)

// Claim implements ports.OutcomeRecords.
func (r *Records) Claim(_ context.Context, keys []string, want string, allocs []string, classes []ports.Class) ([]round.Claim, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Claims = append(r.Claims, ClaimCall{Keys: slices.Clone(keys), Want: want, Allocs: slices.Clone(allocs)})
	if r.Err != nil {
		return nil, r.Err
	}
	if len(keys) == 0 {
		return nil, nil
	}
	out := make([]round.Claim, len(keys))
	for i, k := range keys {
		alloc := ""
		if allocs != nil {
			alloc = allocs[i]
		}
		if v, ok := r.outcomes[k]; ok {
			out[i] = parseOutcome(v)
		} else {
			r.outcomes[k] = joinOutcome(want, alloc)
			out[i] = round.Claim{Outcome: want, Won: true, Alloc: alloc}
		}
		if classes != nil {
			r.classes[ports.RentalOfKey(k)] = classes[i]
		}
		delete(r.pending, ports.RentalOfKey(k))
	}
	return out, nil
}

func joinOutcome(outcome, alloc string) string {
	if alloc == "" {
		return outcome
	}
	return outcome + " " + alloc
}

func parseOutcome(v string) round.Claim {
	for i := range len(v) {
		if v[i] == ' ' {
			return round.Claim{Outcome: v[:i], Alloc: v[i+1:]}
		}
	}
	return round.Claim{Outcome: v}
}

// SetOutcome records an outcome as another replica (or an older version)
// would have: alloc "" names no allocation.
func (r *Records) SetOutcome(key, outcome, alloc string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[key] = joinOutcome(outcome, alloc)
}

// Decided implements ports.OutcomeRecords.
func (r *Records) Decided(_ context.Context, keys []string) ([]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return nil, r.Err
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, out[i] = r.outcomes[k]
	}
	return out, nil
}

// PlacedAfter implements ports.OutcomeRecords.
func (r *Records) PlacedAfter(_ context.Context, rental string, attempt int32) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return false, r.Err
	}
	_, ok := r.outcomes[ports.AttemptKey(rental, attempt+1)]
	return ok, nil
}

// CurrentAttempt implements ports.OutcomeRecords.
func (r *Records) CurrentAttempt(ctx context.Context, rental string) (int32, error) {
	attempt := int32(1)
	for attempt < 64 {
		later, err := r.PlacedAfter(ctx, rental, attempt)
		if err != nil {
			return 0, err
		}
		if !later {
			break
		}
		attempt++
	}
	return attempt, nil
}

// Classes implements ports.OutcomeRecords.
func (r *Records) Classes(_ context.Context, rentals []string) (map[string]ports.Class, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return nil, r.Err
	}
	out := map[string]ports.Class{}
	for _, id := range rentals {
		if c, ok := r.classes[id]; ok {
			out[id] = c
		}
	}
	return out, nil
}

// Placed implements ports.OutcomeRecords.
func (r *Records) Placed(_ context.Context, rental string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.classes[rental]
	return ok, r.Err
}

// Forget implements ports.OutcomeRecords.
func (r *Records) Forget(_ context.Context, rental string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.classes, rental)
	delete(r.preempt, rental)
	return r.Err
}

// ClaimPreemption implements ports.OutcomeRecords.
func (r *Records) ClaimPreemption(_ context.Context, ps []ports.Preemption) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return nil, r.Err
	}
	var taken []string
	for _, p := range ps {
		if held, ok := r.preempt[p.Victim]; ok && held.Preemptor != p.Preemptor {
			taken = append(taken, p.Victim)
		}
	}
	if len(taken) > 0 {
		return taken, nil
	}
	for _, p := range ps {
		if _, ok := r.preempt[p.Victim]; !ok {
			r.preempt[p.Victim] = p
		}
	}
	return nil, nil
}

// Preemptions implements ports.OutcomeRecords.
func (r *Records) Preemptions(context.Context) ([]ports.Preemption, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return nil, r.Err
	}
	out := slices.Collect(maps.Values(r.preempt))
	slices.SortFunc(out, func(a, b ports.Preemption) int { return strings.Compare(a.Victim, b.Victim) })
	return out, nil
}

// StopSent implements ports.OutcomeRecords.
func (r *Records) StopSent(_ context.Context, victim string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.preempt[victim]; ok {
		p.StopSent = true
		r.preempt[victim] = p
	}
	return r.Err
}

// DropPreemption implements ports.OutcomeRecords.
func (r *Records) DropPreemption(_ context.Context, victims ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range victims {
		delete(r.preempt, v)
	}
	return r.Err
}

// PutPending implements ports.OutcomeRecords.
func (r *Records) PutPending(_ context.Context, entries []ports.PendingEntry) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return r.Err
	}
	for _, e := range entries {
		e.Event = proto.Clone(e.Event).(*shizuv1.RentalRequested)
		e.PreferredModels = slices.Clone(e.PreferredModels)
		r.pending[e.Event.GetRentalId()] = e
	}
	return nil
}

// DropPending implements ports.OutcomeRecords.
func (r *Records) DropPending(_ context.Context, rentals ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range rentals {
		delete(r.pending, id)
	}
	return r.Err
}

// Pending implements ports.OutcomeRecords.
func (r *Records) Pending(context.Context) ([]ports.PendingEntry, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Err != nil {
		return nil, nil, r.Err
	}
	keys := slices.Sorted(maps.Keys(r.pending))
	out := make([]ports.PendingEntry, 0, len(keys))
	for _, k := range keys {
		out = append(out, r.pending[k])
	}
	return out, nil, nil
}

// Publisher is a ports.Publisher that keeps what it is given.
type Publisher struct {
	mu sync.Mutex
	// Published are the events of every batch, in publish order; Waited
	// counts the batches waited for.
	Published []Published
	Waited    int
	// PublishErr fails every Publish, WaitErr every Wait.
	PublishErr, WaitErr error
}

// Published is one event given to a batch.
type Published struct {
	Subject string
	Event   proto.Message
}

var _ ports.Publisher = (*Publisher)(nil)

// NewBatch implements ports.Publisher.
func (p *Publisher) NewBatch() ports.Batch { return &batch{p: p} }

// Events are the published events of type T, in order.
func Events[T proto.Message](p *Publisher) []T {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []T
	for _, e := range p.Published {
		if ev, ok := e.Event.(T); ok {
			out = append(out, ev)
		}
	}
	return out
}

type batch struct {
	p      *Publisher
	queued []Published
}

func (b *batch) Publish(_ context.Context, subject string, ev proto.Message) error {
	b.p.mu.Lock()
	defer b.p.mu.Unlock()
	if b.p.PublishErr != nil {
		return b.p.PublishErr
	}
	b.queued = append(b.queued, Published{Subject: subject, Event: proto.Clone(ev)})
	return nil
}

func (b *batch) Wait(context.Context) error {
	b.p.mu.Lock()
	defer b.p.mu.Unlock()
	b.p.Waited++
	if b.p.WaitErr != nil {
		return b.p.WaitErr
	}
	b.p.Published = append(b.p.Published, b.queued...)
	b.queued = nil
	return nil
}
