package agenttest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/shared/bus"
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
