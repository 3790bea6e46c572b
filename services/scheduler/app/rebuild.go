package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/history"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The scheduler's records (outcome claims, classes, the pending set,
// preemptions, spot prices) live in Redis and are lost with it. They are
// rebuilt from the RENTALS stream, which holds every fact they were derived
// from (history.Fold), and the MARKET stream (spot prices), whenever their marker (records.Redis.Rebuilt) is
// missing: before the first batch, before every batch, and every
// RecordsCheck. While one rebuild runs no batch is handled and the loop
// starts no round of its own, so nothing is decided on records that are
// not whole. Rebuilds are idempotent (outcomes are claimed with SET NX),
// so replicas that rebuild at once agree.

// recordsMarker is what the rebuild needs of the records beyond
// ports.OutcomeRecords: the marker that says they are whole.
type recordsMarker interface {
	Rebuilt(ctx context.Context) (bool, error)
	MarkRebuilt(ctx context.Context, upTo uint64) error
}

// rebuild is the replica's side of the records' marker.
type rebuild struct {
	// marker is nil for records that cannot be lost (tests' fakes).
	marker recordsMarker
	// mu is held for writing while the records are rebuilt, for reading
	// by each batch and by the loop's own work (pending retries,
	// preemption stops, reconciling).
	mu sync.RWMutex
	// whole: the last check found the marker.
	whole atomic.Bool
}

// claimChunk bounds the outcomes one claim call restores.
const claimChunk = 500

// ensureRecords checks the marker and, when it is missing, rebuilds the
// records (once, whatever the number of callers waiting).
func (s *Scheduler) ensureRecords(ctx context.Context) error {
	m := s.rebuild.marker
	if m == nil {
		return nil
	}
	ok, err := m.Rebuilt(ctx)
	if err != nil {
		return err
	}
	if ok {
		s.rebuild.whole.Store(true)
		return nil
	}
	s.rebuild.whole.Store(false)
	s.rebuild.mu.Lock()
	defer s.rebuild.mu.Unlock()
	if ok, err := m.Rebuilt(ctx); err != nil || ok {
		s.rebuild.whole.Store(ok)
		return err
	}
	start := time.Now()
	s.d.Log.WarnContext(ctx, "scheduler records missing (Redis lost them, or they were never rebuilt); rebuilding from the rentals stream")
	got, upTo, err := s.rebuildRecords(ctx)
	if err != nil {
		return fmt.Errorf("rebuild scheduler records: %w", err)
	}
	s.rebuild.whole.Store(true)
	s.d.Log.WarnContext(ctx, "scheduler records rebuilt", "up_to_seq", upTo, "decided", len(got.Decided),
		"pending", len(got.Pending), "preemptions", len(got.Preemptions), "took", time.Since(start).String())
	s.wake()
	return nil
}

// gated runs h only on whole records: a batch that finds the marker
// missing waits for the rebuild, and one that cannot check it is retried.
func (s *Scheduler) gated(h bus.BatchHandlerFunc) bus.BatchHandlerFunc {
	if s.rebuild.marker == nil {
		return h
	}
	return func(ctx context.Context, ds []bus.Delivery) []error {
		if err := s.ensureRecords(ctx); err != nil {
			errs := make([]error, len(ds))
			for i := range errs {
				errs[i] = fault.Unavailable("scheduler records not whole: %w", err)
			}
			return errs
		}
		s.rebuild.mu.RLock()
		defer s.rebuild.mu.RUnlock()
		return h(ctx, ds)
	}
}

// onWholeRecords runs the loop's own work f only while no rebuild runs
// and the last check found the records whole; otherwise it skips it (the
// next tick tries again). It never waits: a batch that holds the records
// may be waiting for this loop.
func (s *Scheduler) onWholeRecords(f func()) {
	if s.rebuild.marker == nil {
		f()
		return
	}
	if !s.rebuild.whole.Load() || !s.rebuild.mu.TryRLock() {
		return
	}
	defer s.rebuild.mu.RUnlock()
	f()
}

// checkRecordsLoop checks the marker every RecordsCheck until ctx ends.
func (s *Scheduler) checkRecordsLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.RecordsCheck)
	defer t.Stop()
	for {
		if err := s.ensureRecords(ctx); err != nil && ctx.Err() == nil {
			s.d.Log.WarnContext(ctx, "check scheduler records", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rebuildRecords folds the rentals stream and writes what it says: the
// rental owners, the outcomes, then the preemptions, then the pending requests still
// undecided, and the marker last.
func (s *Scheduler) rebuildRecords(ctx context.Context) (history.Records, uint64, error) {
	f := history.New(s.source)
	upTo, err := s.replayHandled(ctx, topology.StreamRentals, func(m *jetstream.RawStreamMsg) error {
		if ev := rentalEvent(m); ev != nil {
			f.Add(ev)
		}
		return nil
	})
	if err != nil {
		return history.Records{}, 0, err
	}
	if err := s.restoreSpotPrices(ctx); err != nil {
		return history.Records{}, 0, err
	}
	got := f.Records()
	if err := s.restoreOwners(ctx, got.Owners); err != nil {
		return got, upTo, err
	}
	if err := s.restoreDecided(ctx, got.Decided); err != nil {
		return got, upTo, err
	}
	if err := s.restorePreemptions(ctx, got.Preemptions); err != nil {
		return got, upTo, err
	}
	if err := s.restorePending(ctx, got.Pending); err != nil {
		return got, upTo, err
	}
	return got, upTo, s.rebuild.marker.MarkRebuilt(ctx, upTo)
}

// replayHandled is replay, unless the scheduler's durable on stream never
// delivered a message (a first start, its backlog still queued): then
// nothing was decided that a record could hold, and the records are whole
// as they are.
func (s *Scheduler) replayHandled(ctx context.Context, stream string, use func(*jetstream.RawStreamMsg) error) (uint64, error) {
	svc, _ := topology.ServiceNamed(topology.Scheduler)
	for _, c := range svc.Consumers {
		if c.Stream != stream {
			continue
		}
		cons, err := s.d.Bus.JetStream().Consumer(ctx, stream, c.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if cons.CachedInfo().Delivered.Stream == 0 {
			return 0, nil
		}
	}
	return s.replay(ctx, stream, use)
}

// replay hands every message of stream, in stream order, to use, and
// returns the last sequence it read.
func (s *Scheduler) replay(ctx context.Context, stream string, use func(*jetstream.RawStreamMsg) error) (uint64, error) {
	return bus.ScanStream(ctx, s.d.Bus.JetStream(), stream, ">", use)
}

// restoreSpotPrices records again every spot price of the MARKET stream
// (the store keeps, per zone and model, the one in force from latest).
func (s *Scheduler) restoreSpotPrices(ctx context.Context) error {
	if s.market == nil {
		return nil
	}
	_, err := s.replayHandled(ctx, topology.StreamMarket, func(m *jetstream.RawStreamMsg) error {
		ev := &shizuv1.SpotPriceChanged{}
		if event, _ := bus.EventOn(m.Subject); event != bus.EventName(ev) || proto.Unmarshal(m.Data, ev) != nil || ev.GetEffectiveAt() == nil {
			return nil
		}
		p := ev.GetPricePerGpuHour()
		_, err := s.market.SetSpotPrice(ctx, ports.SpotPrice{Zone: ev.GetZone(), Model: ev.GetModel(),
			Price: placement.Price{Micros: p.GetMicros(), Currency: p.GetCurrency()}, EffectiveAt: ev.GetEffectiveAt().AsTime()})
		return err
	})
	return err
}

// rentalEvent decodes the rental events the fold reads; nil for the rest
// and for what does not decode (the consumers dead-letter that).
func rentalEvent(m *jetstream.RawStreamMsg) proto.Message {
	var ev proto.Message
	switch m.Subject[strings.LastIndexByte(m.Subject, '.')+1:] {
	case "requested":
		ev = &shizuv1.RentalRequested{}
	case "scheduled":
		ev = &shizuv1.RentalScheduled{}
	case "pending":
		ev = &shizuv1.RentalPending{}
	case "rejected":
		ev = &shizuv1.RentalRejected{}
	case "stopped":
		ev = &shizuv1.RentalStopped{}
	case "preempted":
		ev = &shizuv1.RentalPreempted{}
	case "migrating":
		ev = &shizuv1.RentalMigrating{}
	case "cancel_requested":
		ev = &shizuv1.RentalCancelRequested{}
	default:
		return nil
	}
	if proto.Unmarshal(m.Data, ev) != nil {
		return nil
	}
	return ev
}

// restoreDecided claims every decided attempt's outcome again, with the
// class of each rental still running (which keeps the reconciler off its
// allocation). A scheduled claim names no allocation: a redelivered
// request then keeps the allocation the store hands back as existing
// (round.KeepReservation).
func (s *Scheduler) restoreDecided(ctx context.Context, decided []history.Decided) error {
	type group struct {
		outcome string
		keys    []string
		classes []ports.Class // running rentals only
	}
	running := &group{outcome: round.OutcomeScheduled}
	others := map[string]*group{}
	for _, d := range decided {
		key := ports.AttemptKey(d.Rental, d.Attempt)
		if d.Running {
			running.keys = append(running.keys, key)
			running.classes = append(running.classes, classOf(d.Request))
			continue
		}
		g, ok := others[d.Outcome]
		if !ok {
			g = &group{outcome: d.Outcome}
			others[d.Outcome] = g
		}
		g.keys = append(g.keys, key)
	}
	for _, g := range append([]*group{running}, others[round.OutcomeScheduled], others[round.OutcomeRejected], others[round.OutcomeCancelled]) {
		if g == nil {
			continue
		}
		for start := 0; start < len(g.keys); start += claimChunk {
			end := min(len(g.keys), start+claimChunk)
			var classes []ports.Class
			if g.classes != nil {
				classes = g.classes[start:end]
			}
			if _, err := s.rec.Claim(ctx, g.keys[start:end], g.outcome, nil, classes); err != nil {
				return err
			}
		}
	}
	return nil
}

// classOf is the class a placed rental's request gives it (on-demand when
// the stream no longer holds the request).
func classOf(req *shizuv1.RentalRequested) ports.Class {
	if req == nil {
		return ports.Class{Class: rent.ClassOnDemand}
	}
	r := requestOf(req)
	return ports.Class{Class: r.Class, Priority: r.Priority, MaxSpotPrice: r.MaxSpotPrice}
}

// restorePreemptions records again the preemptions whose victims still run.
func (s *Scheduler) restorePreemptions(ctx context.Context, ps []history.Preemption) error {
	for _, p := range ps {
		_, err := s.rec.ClaimPreemption(ctx, []ports.Preemption{{Victim: p.Victim, Tenant: p.Tenant, Preemptor: p.Preemptor,
			NodeID: p.NodeID, NodeEpoch: uint64(max(p.NodeEpoch, 1)), Notice: p.Notice}})
		if err != nil {
			return err
		}
	}
	return nil
}

// restorePending puts the requests still undecided back in the pending
// set, as their own events (their deadlines run from when they were
// made); one another replica decided meanwhile is left out.
func (s *Scheduler) restorePending(ctx context.Context, pending []history.Pending) error {
	for start := 0; start < len(pending); start += claimChunk {
		chunk := pending[start:min(len(pending), start+claimChunk)]
		keys := make([]string, len(chunk))
		for i, p := range chunk {
			keys[i] = ports.AttemptKey(p.Event.GetRentalId(), p.Attempt)
		}
		decided, err := s.rec.Decided(ctx, keys)
		if err != nil {
			return err
		}
		var entries []ports.PendingEntry
		for i, p := range chunk {
			if !decided[i] {
				entries = append(entries, ports.PendingEntry{Event: p.Event, Reason: p.Reason, Attempt: p.Attempt,
					PreferredModels: p.PreferredModels})
			}
		}
		if err := s.rec.PutPending(ctx, entries); err != nil {
			return err
		}
	}
	return nil
}
