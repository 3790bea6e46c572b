// Package metertest holds hand-written recording fakes of the metering
// app's ports (app.Store, app.Publisher) and one contract suite per port,
// which the real adapters (redisstore against a real Redis, the bus
// publisher against a real NATS) and the fakes both pass.
package metertest

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
)

// Store is an in-memory app.Store that applies the ledger's merge rule
// (ledger.Merge, ledger.Advance.Apply, ledger.EarliestLoss) as
// redisstore's scripts do. It records every call (Calls, Advances) and
// fails a method with Fail[method] when that is set.
type Store struct {
	mu       sync.Mutex
	segs     map[ledger.SegmentRef]placement
	lost     map[ledger.SegmentRef]time.Time
	attempts map[string]map[int32]bool
	spot     map[string][]ledger.PricePoint
	seen     map[string]bool
	spent    map[string]int64
	alerted  map[string][]int64

	// Fail makes the named method ("MergeSegments", "AdvanceAll", ...)
	// return its error.
	Fail map[string]error
	// Calls are the methods called, in order.
	Calls []string
	// Advances are every advance applied, in order.
	Advances []ledger.Advance
}

type placement struct {
	st  ledger.SegmentState
	due ledger.DueEntry
}

var _ app.Store = (*Store)(nil)

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{segs: map[ledger.SegmentRef]placement{}, lost: map[ledger.SegmentRef]time.Time{},
		attempts: map[string]map[int32]bool{}, spot: map[string][]ledger.PricePoint{}, seen: map[string]bool{},
		spent: map[string]int64{}, alerted: map[string][]int64{}, Fail: map[string]error{}}
}

// call records a call and returns its injected error; s.mu is held.
func (s *Store) call(method string) error {
	s.Calls = append(s.Calls, method)
	return s.Fail[method]
}

// MergeSegments implements app.SegmentStore.
func (s *Store) MergeSegments(_ context.Context, events []ledger.SegmentEvent) ([]ledger.SegmentState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("MergeSegments"); err != nil {
		return nil, err
	}
	var order []ledger.SegmentRef
	for _, ev := range events {
		if !slices.Contains(order, ev.Ref) {
			order = append(order, ev.Ref)
		}
		p := s.segs[ev.Ref]
		p.st.RentalID, p.st.Attempt = ev.Ref.RentalID, ev.Ref.Attempt
		p.st, p.due = ledger.Merge(p.st, p.due, ev)
		s.segs[ev.Ref] = p
		if ev.RecordsAttempt() {
			if s.attempts[ev.Ref.RentalID] == nil {
				s.attempts[ev.Ref.RentalID] = map[int32]bool{}
			}
			s.attempts[ev.Ref.RentalID][ev.Ref.Attempt] = true
		}
	}
	out := make([]ledger.SegmentState, len(order))
	for i, r := range order {
		out[i] = s.segs[r].st
		out[i].LostAt = s.lost[r]
	}
	return out, nil
}

// AdvanceAll implements app.SegmentStore.
func (s *Store) AdvanceAll(_ context.Context, as []ledger.Advance) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(as) == 0 {
		return nil // as redisstore: no call at all
	}
	if err := s.call("AdvanceAll"); err != nil {
		return err
	}
	for _, a := range as {
		p := s.segs[a.Ref]
		p.st.RentalID, p.st.Attempt = a.Ref.RentalID, a.Ref.Attempt
		p.st, p.due = a.Apply(p.st, p.due)
		s.segs[a.Ref] = p
		s.Advances = append(s.Advances, a)
	}
	return nil
}

// Due implements app.SegmentStore.
func (s *Store) Due(_ context.Context, t time.Time, limit int64) ([]ledger.SegmentRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Due"); err != nil {
		return nil, err
	}
	var out []ledger.SegmentRef
	for r, p := range s.segs {
		if p.due.Listed && p.due.At.Unix() <= t.Unix() {
			out = append(out, r)
		}
	}
	member := func(r ledger.SegmentRef) string { return r.RentalID + " " + strconv.Itoa(int(r.Attempt)) }
	slices.SortFunc(out, func(a, b ledger.SegmentRef) int {
		return cmp.Or(cmp.Compare(s.segs[a].due.At.Unix(), s.segs[b].due.At.Unix()), cmp.Compare(member(a), member(b)))
	})
	if int64(len(out)) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Lost implements app.SegmentStore.
func (s *Store) Lost(_ context.Context, rental string, attempt int32, lastHeartbeat time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Lost"); err != nil {
		return err
	}
	r := ledger.SegmentRef{RentalID: rental, Attempt: attempt}
	s.lost[r] = ledger.EarliestLoss(s.lost[r], lastHeartbeat.UTC())
	return nil
}

// DropParked implements app.SegmentStore.
func (s *Store) DropParked(_ context.Context, ref ledger.SegmentRef) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("DropParked"); err != nil {
		return false, err
	}
	if p, ok := s.segs[ref]; ok && p.st.Scheduled {
		return false, nil
	}
	delete(s.segs, ref)
	return true, nil
}

// Attempts implements app.SegmentStore.
func (s *Store) Attempts(_ context.Context, rental string) ([]int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Attempts"); err != nil {
		return nil, err
	}
	out := make([]int32, 0, len(s.attempts[rental]))
	for a := range s.attempts[rental] {
		out = append(out, a)
	}
	slices.Sort(out)
	return out, nil
}

// SpotPrice implements app.SegmentStore.
func (s *Store) SpotPrice(_ context.Context, zone, model string, p ledger.PricePoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("SpotPrice"); err != nil {
		return err
	}
	k := zone + " " + model
	p.At = p.At.UTC()
	if !slices.Contains(s.spot[k], p) {
		s.spot[k] = append(s.spot[k], p)
	}
	return nil
}

// SpotPrices implements app.SegmentStore: as redisstore, the history up
// to the millisecond after until.
func (s *Store) SpotPrices(_ context.Context, zone, model string, until time.Time) ([]ledger.PricePoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("SpotPrices"); err != nil {
		return nil, err
	}
	var out []ledger.PricePoint
	for _, p := range s.spot[zone+" "+model] {
		if until.IsZero() || p.At.UnixMilli() <= until.UnixMilli()+1 {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b ledger.PricePoint) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Price.Micros, b.Price.Micros))
	})
	return out, nil
}

// ApplyAll implements app.UsageStore (one generation only).
func (s *Store) ApplyAll(_ context.Context, _ string, rs []*shizuv1.UsageRecorded) ([]redisstore.Applied, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(rs) == 0 {
		return nil, nil
	}
	if err := s.call("ApplyAll"); err != nil {
		return nil, err
	}
	out := make([]redisstore.Applied, len(rs))
	for i, r := range rs {
		k := r.GetTenantId() + " " + ledger.Month(r.GetIntervalStart().AsTime()) + " " + r.GetAmount().GetCurrency()
		before := s.spent[k]
		if id := r.GetMeta().GetEventId(); !s.seen[id] {
			s.seen[id] = true
			s.spent[k] += r.GetAmount().GetMicros()
			out[i].New = true
		}
		out[i].MonthBefore, out[i].MonthAfter = before, s.spent[k]
	}
	return out, nil
}

// Alerts implements app.UsageStore.
func (s *Store) Alerts(_ context.Context, tenant, month string) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Alerts"); err != nil {
		return nil, err
	}
	out := slices.Clone(s.alerted[tenant+" "+month])
	slices.Sort(out)
	return out, nil
}

// Alert implements app.UsageStore.
func (s *Store) Alert(_ context.Context, tenant, month string, threshold int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.call("Alert"); err != nil {
		return false, err
	}
	k := tenant + " " + month
	if slices.Contains(s.alerted[k], threshold) {
		return false, nil
	}
	s.alerted[k] = append(s.alerted[k], threshold)
	return true, nil
}

// Segment is what the store holds of a placement, loss included.
func (s *Store) Segment(ref ledger.SegmentRef) (ledger.SegmentState, ledger.DueEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.segs[ref]
	p.st.LostAt = s.lost[ref]
	return p.st, p.due
}

// Message is one published event.
type Message struct {
	Subject string
	Event   proto.Message
}

// ID is the message's event id.
func (m Message) ID() string { return bus.EventID(m.Event) }

// Publisher is a recording app.Publisher. Stored are the events the
// stream would hold (each event id once, in the order first stored);
// Published counts every event a successful Wait delivered, repeats
// included. FailPublish and FailWait inject errors into every batch.
type Publisher struct {
	mu          sync.Mutex
	stored      []Message
	ids         map[string]bool
	published   int
	deadLetters []app.DeadLetter
	dlIDs       map[string]bool
	FailPublish error
	FailWait    error
	// FailDeadLetter makes DeadLetter fail.
	FailDeadLetter error
}

var _ app.Publisher = (*Publisher)(nil)

// NewPublisher returns a publisher that has published nothing.
func NewPublisher() *Publisher { return &Publisher{ids: map[string]bool{}, dlIDs: map[string]bool{}} }

// DeadLetter implements app.Publisher: each id is stored once.
func (p *Publisher) DeadLetter(_ context.Context, dl app.DeadLetter) error {
	if p.FailDeadLetter != nil {
		return p.FailDeadLetter
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dlIDs[dl.ID] {
		p.dlIDs[dl.ID] = true
		dl.Event = proto.Clone(dl.Event)
		p.deadLetters = append(p.deadLetters, dl)
	}
	return nil
}

// DeadLetters are the dead letters stored, each id once.
func (p *Publisher) DeadLetters() []app.DeadLetter {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.deadLetters)
}

// NewBatch implements app.Publisher.
func (p *Publisher) NewBatch() app.PublishBatch { return &batch{p: p} }

// Stored are the events stored, each id once.
func (p *Publisher) Stored() []Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.stored)
}

// Published counts the events delivered, repeats included.
func (p *Publisher) Published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published
}

type batch struct {
	p       *Publisher
	pending []Message
}

func (b *batch) Publish(_ context.Context, subject string, ev proto.Message) error {
	if b.p.FailPublish != nil {
		return b.p.FailPublish
	}
	b.pending = append(b.pending, Message{Subject: subject, Event: proto.Clone(ev)})
	return nil
}

func (b *batch) Len() int { return len(b.pending) }

func (b *batch) Wait(context.Context) error {
	pending := b.pending
	b.pending = nil
	if b.p.FailWait != nil {
		return b.p.FailWait
	}
	b.p.mu.Lock()
	defer b.p.mu.Unlock()
	for _, m := range pending {
		b.p.published++
		if id := m.ID(); !b.p.ids[id] {
			b.p.ids[id] = true
			b.p.stored = append(b.p.stored, m)
		}
	}
	return nil
}
