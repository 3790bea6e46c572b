// Package failovertest holds what tests of the failover app share: one
// contract suite per interface the app needs of its records and of the bus
// (each an exported Run…Contract function that the real adapter passes
// against real Redis or NATS and the fakes here pass too), and the fakes:
// hand-written, in memory, recording every call and able to fail any of
// them.
package failovertest

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Calls records what a fake was asked, and fails what it is told to.
type Calls struct {
	mu    sync.Mutex
	calls []string
	fail  map[string]error
}

// FailOn makes every later call of method (e.g. "GetMany") return err;
// a nil err heals it.
func (c *Calls) FailOn(method string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail == nil {
		c.fail = map[string]error{}
	}
	c.fail[method] = err
}

// Calls lists the methods called so far, in order.
func (c *Calls) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func (c *Calls) call(method string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, method)
	return c.fail[method]
}

// Placements is an in-memory PlacementRecords.
type Placements struct {
	Calls
	mu   sync.Mutex
	byID map[string]migrate.Placement
}

// NewPlacements returns empty placement records.
func NewPlacements() *Placements { return &Placements{byID: map[string]migrate.Placement{}} }

// Put keeps the highest attempt.
func (p *Placements) Put(_ context.Context, rental string, pl migrate.Placement) error {
	if err := p.call("Put"); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.byID[rental]; ok && cur.Attempt > pl.Attempt {
		return nil
	}
	pl.Spec = proto.CloneOf(pl.Spec)
	p.byID[rental] = pl
	return nil
}

// Forget drops the record if it is still attempt.
func (p *Placements) Forget(_ context.Context, rental string, attempt int32) error {
	if err := p.call("Forget"); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.byID[rental]; ok && cur.Attempt == attempt {
		delete(p.byID, rental)
	}
	return nil
}

// Get returns the rental's latest placement.
func (p *Placements) Get(_ context.Context, rental string) (migrate.Placement, bool, error) {
	if err := p.call("Get"); err != nil {
		return migrate.Placement{}, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pl, ok := p.byID[rental]
	return pl, ok, nil
}

// GetMany returns the placements of the rentals placed.
func (p *Placements) GetMany(_ context.Context, rentals []string) (map[string]migrate.Placement, error) {
	if err := p.call("GetMany"); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]migrate.Placement{}
	for _, id := range rentals {
		if pl, ok := p.byID[id]; ok {
			out[id] = pl
		}
	}
	return out, nil
}

// Moves is an in-memory MoveRecords.
type Moves struct {
	Calls
	mu   sync.Mutex
	byID map[string]migrate.Record
}

// NewMoves returns empty move records.
func NewMoves() *Moves { return &Moves{byID: map[string]migrate.Record{}} }

func clone(m migrate.Record) migrate.Record {
	m.GPUs = slices.Clone(m.GPUs)
	return m
}

// Put records m.
func (s *Moves) Put(_ context.Context, m migrate.Record) error {
	if err := s.call("Put"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[m.Rental] = clone(m)
	return nil
}

// PutMany records every move.
func (s *Moves) PutMany(_ context.Context, ms []migrate.Record) error {
	if err := s.call("PutMany"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		s.byID[m.Rental] = clone(m)
	}
	return nil
}

// UpdateMany rewrites the moves still recorded.
func (s *Moves) UpdateMany(_ context.Context, ms []migrate.Record) error {
	if err := s.call("UpdateMany"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		if _, ok := s.byID[m.Rental]; ok {
			s.byID[m.Rental] = clone(m)
		}
	}
	return nil
}

// Get returns the rental's move.
func (s *Moves) Get(_ context.Context, rental string) (migrate.Record, bool, error) {
	if err := s.call("Get"); err != nil {
		return migrate.Record{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.byID[rental]
	return clone(m), ok, nil
}

// GetMany returns the moves of the rentals that have one.
func (s *Moves) GetMany(_ context.Context, rentals []string) (map[string]migrate.Record, error) {
	if err := s.call("GetMany"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]migrate.Record{}
	for _, id := range rentals {
		if m, ok := s.byID[id]; ok {
			out[id] = clone(m)
		}
	}
	return out, nil
}

// List lists the rentals with a move, sorted.
func (s *Moves) List(_ context.Context) ([]string, error) {
	if err := s.call("List"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.byID)), nil
}

// Drop forgets the rental's move.
func (s *Moves) Drop(_ context.Context, rental string) error {
	if err := s.call("Drop"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, rental)
	return nil
}

// Quarantines is an in-memory QuarantineRecords.
type Quarantines struct {
	Calls
	mu     sync.Mutex
	byNode map[string]detect.Quarantine
}

// NewQuarantines returns empty quarantine records.
func NewQuarantines() *Quarantines { return &Quarantines{byNode: map[string]detect.Quarantine{}} }

// Put records q (its node, epoch and end).
func (s *Quarantines) Put(_ context.Context, q detect.Quarantine) error {
	if err := s.call("Put"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byNode[q.Node] = detect.Quarantine{Node: q.Node, Epoch: q.Epoch, Until: q.Until}
	return nil
}

// List returns every quarantine, by node.
func (s *Quarantines) List(_ context.Context) ([]detect.Quarantine, error) {
	if err := s.call("List"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.byNode))
	slices.SortFunc(out, func(a, b detect.Quarantine) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

// Drop ends the node's quarantine.
func (s *Quarantines) Drop(_ context.Context, node string) error {
	if err := s.call("Drop"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byNode, node)
	return nil
}

// Event is one event as it reached the bus.
type Event struct {
	Subject string
	ID      string
	Message proto.Message
}

// Bus is an in-memory bus: batches from NewBatch deliver their events when
// waited, once per event id, as the stream deduplicates.
type Bus struct {
	Calls
	mu        sync.Mutex
	delivered []Event
	seen      map[string]bool
	// refuse, when set, is asked about every publish: a non-nil answer is
	// returned by Batch.Publish (the event is not queued).
	refuse func(subject string, ev proto.Message) error
}

// NewBus returns an empty bus.
func NewBus() *Bus { return &Bus{seen: map[string]bool{}} }

// Refuse makes Publish return what refuse answers for an event.
func (b *Bus) Refuse(refuse func(subject string, ev proto.Message) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = refuse
}

// Delivered lists the events delivered so far, in order.
func (b *Bus) Delivered() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.delivered)
}

// NewBatch starts a batch.
func (b *Bus) NewBatch() *Batch { return &Batch{bus: b} }

// Batch is one batch of the in-memory bus.
type Batch struct {
	bus     *Bus
	pending []Event
}

// Publish queues ev; an event without an id is refused as invalid, like
// the real bus does.
func (b *Batch) Publish(_ context.Context, subject string, ev proto.Message) error {
	if err := b.bus.call("Publish"); err != nil {
		return err
	}
	b.bus.mu.Lock()
	refuse := b.bus.refuse
	b.bus.mu.Unlock()
	if refuse != nil {
		if err := refuse(subject, ev); err != nil {
			return err
		}
	}
	id := bus.EventID(ev)
	if id == "" {
		return fault.Invalid("publish to %s: meta.event_id is empty", subject)
	}
	b.pending = append(b.pending, Event{Subject: subject, ID: id, Message: proto.Clone(ev)})
	return nil
}

// Len is the number of queued events.
func (b *Batch) Len() int { return len(b.pending) }

// Wait delivers the queued events (an id delivered before is dropped).
func (b *Batch) Wait(_ context.Context) error {
	if err := b.bus.call("Wait"); err != nil {
		b.pending = b.pending[:0] // like the real batch: empty after a Wait
		return err
	}
	b.bus.mu.Lock()
	defer b.bus.mu.Unlock()
	for _, e := range b.pending {
		if !b.bus.seen[e.ID] {
			b.bus.seen[e.ID] = true
			b.bus.delivered = append(b.bus.delivered, e)
		}
	}
	b.pending = b.pending[:0]
	return nil
}
