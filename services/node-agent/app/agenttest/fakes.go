package agenttest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Published is one call of Bus.Publish: what was asked, and what it
// returned.
type Published struct {
	Subject string
	Event   proto.Message
	Err     error
}

// Bus is a recording fake Publisher: it holds each event once per event
// id, as JetStream's duplicate window does, refuses what the bus refuses
// (no id, an event that does not encode, an ended context), and fails a
// call when Refuse says so.
type Bus struct {
	mu     sync.Mutex
	refuse func(subject string, ev proto.Message) error
	calls  []Published
	held   map[string][][]byte // by subject
	seen   map[string]bool     // event ids
}

// NewBus is an empty Bus that takes every valid event.
func NewBus() *Bus { return &Bus{held: map[string][][]byte{}, seen: map[string]bool{}} }

// Refuse makes each later call fail with refuse's error when it returns
// one (nil: back to taking every valid event).
func (b *Bus) Refuse(refuse func(subject string, ev proto.Message) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = refuse
}

// Publish holds ev on subject unless its id was held before.
func (b *Bus) Publish(ctx context.Context, subj string, ev proto.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.publish(ctx, subj, ev)
	b.calls = append(b.calls, Published{Subject: subj, Event: proto.Clone(ev), Err: err})
	return err
}

func (b *Bus) publish(ctx context.Context, subj string, ev proto.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.refuse != nil {
		if err := b.refuse(subj, ev); err != nil {
			return err
		}
	}
	id := bus.EventID(ev)
	if id == "" {
		return fmt.Errorf("publish %s to %s: meta.event_id is empty", bus.EventName(ev), subj)
	}
	data, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode %s: %w", bus.EventName(ev), err)
	}
	if !b.seen[id] {
		b.seen[id] = true
		b.held[subj] = append(b.held[subj], data)
	}
	return nil
}

// Calls returns every call so far, refused ones included, oldest first.
func (b *Bus) Calls() []Published {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls)
}

// Held returns the encoded events held on subject, oldest first.
func (b *Bus) Held(subj string) [][]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.held[subj])
}

// Beat is one call of Beats.Beat.
type Beat struct {
	Node  string
	Epoch int64
	Err   error
}

// Beats is a recording fake Heartbeat: it keeps each node's latest epoch
// (it never expires: tests that need expiry use the real bucket), refuses
// a node id that is not a subject token or an ended context, and fails a
// call when Refuse says so.
type Beats struct {
	mu     sync.Mutex
	refuse func(node string) error
	calls  []Beat
	epochs map[string]int64
}

// NewBeats is a Beats where no node is alive.
func NewBeats() *Beats { return &Beats{epochs: map[string]int64{}} }

// Refuse makes each later beat fail with refuse's error when it returns
// one.
func (h *Beats) Refuse(refuse func(node string) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refuse = refuse
}

// Beat keeps epoch as node's latest.
func (h *Beats) Beat(ctx context.Context, node string, epoch int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := ctx.Err()
	if err == nil && h.refuse != nil {
		err = h.refuse(node)
	}
	if err == nil {
		if terr := subject.Token(node); terr != nil {
			err = fmt.Errorf("heartbeat: node id: %w", terr)
		}
	}
	if err == nil {
		h.epochs[node] = epoch
	}
	h.calls = append(h.calls, Beat{Node: node, Epoch: epoch, Err: err})
	return err
}

// Alive reports whether node beat, and its latest epoch.
func (h *Beats) Alive(node string) (bool, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.epochs[node]
	return ok, e
}

// Calls returns every beat so far, refused ones included, oldest first.
func (h *Beats) Calls() []Beat {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// Capacity is a recording fake of the capacity store's node records, with
// the rules the agent relies on (RunNodeRecordsContract) and nothing of
// free capacity: Reserve takes no resources. Refuse injects errors.
type Capacity struct {
	mu     sync.Mutex
	refuse func(method string) error
	calls  []string
	nodes  map[string]*storedNode
	// generation is the store's generation ("" until a registration);
	// lost counts Lose calls, to make each generation new.
	generation string
	lost       int
}

type storedNode struct {
	node   capacity.Node
	status capacity.NodeStatus
	epoch  uint64
	allocs map[string]uint64 // rental id -> epoch it was made at
}

// NewCapacity is a store without nodes.
func NewCapacity() *Capacity { return &Capacity{nodes: map[string]*storedNode{}} }

// Refuse makes each later call whose method refuse names fail with its
// error ("Register", "Node", "Renew", "SetStatus", "Allocations").
func (c *Capacity) Refuse(refuse func(method string) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse = refuse
}

// Calls returns the methods called so far, oldest first.
func (c *Capacity) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// call records method and returns the injected error; call with c.mu held.
func (c *Capacity) call(method string) error {
	c.calls = append(c.calls, method)
	if c.refuse != nil {
		return c.refuse(method)
	}
	return nil
}

func notFound(what string) error { return fmt.Errorf("capacity: %w: %s", capacity.ErrNotFound, what) }

// Register records n: a new node is ready at epoch 1, a known one keeps
// its epoch, allocations and status, a dead one is ready again.
func (c *Capacity) Register(_ context.Context, n capacity.Node) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Register"); err != nil {
		return 0, err
	}
	if err := n.Validate(); err != nil {
		return 0, fmt.Errorf("capacity: register node %s: %w", n.ID, err)
	}
	c.ensureGeneration()
	s := c.nodes[n.ID]
	if s == nil {
		s = &storedNode{status: capacity.StatusReady, epoch: 1, allocs: map[string]uint64{}}
		c.nodes[n.ID] = s
	}
	s.node = n
	if s.status == capacity.StatusDead {
		s.status = capacity.StatusReady
	}
	return s.epoch, nil
}

// Node reads a node's facts, status, epoch and allocations.
func (c *Capacity) Node(_ context.Context, nodeID string) (capacity.NodeState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Node"); err != nil {
		return capacity.NodeState{}, err
	}
	s := c.nodes[nodeID]
	if s == nil {
		return capacity.NodeState{}, notFound("no such node " + nodeID)
	}
	return capacity.NodeState{Node: s.node, Status: s.status, Epoch: s.epoch, Allocations: s.allocations(nodeID)}, nil
}

func (s *storedNode) allocations(nodeID string) []capacity.Allocation {
	out := make([]capacity.Allocation, 0, len(s.allocs))
	for r, e := range s.allocs {
		out = append(out, capacity.Allocation{Placement: capacity.Placement{RentalID: r, NodeID: nodeID, Epoch: e}})
	}
	slices.SortFunc(out, func(a, b capacity.Allocation) int { return cmp.Compare(a.RentalID, b.RentalID) })
	return out
}

// Renew checks that the node holds rentalID under epoch.
func (c *Capacity) Renew(_ context.Context, rentalID, nodeID string, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Renew"); err != nil {
		return err
	}
	s := c.nodes[nodeID]
	switch {
	case s == nil:
		return notFound("no such node " + nodeID)
	case s.status == capacity.StatusDead:
		return fmt.Errorf("capacity: %w: node %s is dead at epoch %d", capacity.ErrFenced, nodeID, s.epoch)
	case s.epoch != epoch:
		return fmt.Errorf("capacity: %w: node %s is at epoch %d, agent holds %d", capacity.ErrFenced, nodeID, s.epoch, epoch)
	}
	made, ok := s.allocs[rentalID]
	switch {
	case !ok:
		return notFound("node " + nodeID + " holds no allocation of " + rentalID)
	case made != s.epoch:
		return fmt.Errorf("capacity: %w: allocation made at epoch %d, node is at %d", capacity.ErrFenced, made, s.epoch)
	}
	return nil
}

// SetStatus switches a live node between ready and draining at its epoch.
func (c *Capacity) SetStatus(_ context.Context, nodeID string, status capacity.NodeStatus, expectedEpoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("SetStatus"); err != nil {
		return err
	}
	s := c.nodes[nodeID]
	switch {
	case status != capacity.StatusReady && status != capacity.StatusDraining:
		return fmt.Errorf("capacity: %w: status %q", capacity.ErrInvalid, status)
	case s == nil:
		return notFound("no such node " + nodeID)
	case s.status == capacity.StatusDead:
		return fmt.Errorf("capacity: %w: node %s is dead", capacity.ErrFenced, nodeID)
	case s.epoch != expectedEpoch:
		return fmt.Errorf("capacity: %w: node %s is at epoch %d, caller expected %d", capacity.ErrConflict, nodeID, s.epoch, expectedEpoch)
	}
	s.status = status
	return nil
}

// Allocations returns the node's allocations, fenced ones included, by
// rental id.
func (c *Capacity) Allocations(_ context.Context, nodeID string) ([]capacity.Allocation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Allocations"); err != nil {
		return nil, err
	}
	s := c.nodes[nodeID]
	if s == nil {
		return nil, nil
	}
	return s.allocations(nodeID), nil
}

// Reserve records rentalID on a ready node at epoch, as the scheduler
// would (it takes no resources).
func (c *Capacity) Reserve(rentalID, nodeID string, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.nodes[nodeID]
	switch {
	case s == nil:
		return notFound("no such node " + nodeID)
	case s.status != capacity.StatusReady || s.epoch != epoch:
		return fmt.Errorf("capacity: %w: node %s is %s at epoch %d", capacity.ErrFenced, nodeID, s.status, s.epoch)
	}
	s.allocs[rentalID] = epoch
	return nil
}

// Fence kills a node at epoch, as failover would: its epoch moves on by
// one; its allocations stay recorded.
func (c *Capacity) Fence(nodeID string, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.nodes[nodeID]
	switch {
	case s == nil:
		return notFound("no such node " + nodeID)
	case s.epoch != epoch:
		return fmt.Errorf("capacity: %w: node %s is at epoch %d", capacity.ErrConflict, nodeID, s.epoch)
	}
	s.status, s.epoch = capacity.StatusDead, s.epoch+1
	return nil
}
