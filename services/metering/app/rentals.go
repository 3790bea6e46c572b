package app

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Event names the consumers handle.
var (
	eventScheduled = bus.EventName(&shizuv1.RentalScheduled{})
	eventStarted   = bus.EventName(&shizuv1.RentalStarted{})
	eventStopped   = bus.EventName(&shizuv1.RentalStopped{})
	eventMigrating = bus.EventName(&shizuv1.RentalMigrating{})
	eventMigrated  = bus.EventName(&shizuv1.RentalMigrated{})
	eventPreempted = bus.EventName(&shizuv1.RentalPreempted{})
	eventUsage     = bus.EventName(&shizuv1.UsageRecorded{})
)

// decode decodes and validates a delivery; what fails is invalid input.
func decode(d bus.Delivery, ev proto.Message) error {
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return fault.Invalid("decode %s: %w", d.Event, err)
	}
	if v, ok := ev.(bus.Validator); ok {
		if err := v.Validate(); err != nil {
			return fault.Invalid("validate %s: %w", d.Event, err)
		}
	}
	return nil
}

// rentalBatch is a batch of rental deliveries sorted by what they do.
type rentalBatch struct {
	out    []error                    // one per delivery
	events []ledger.SegmentEvent      // segment changes to merge
	merged []int                      // delivery of each event
	lost   []*shizuv1.RentalMigrating // failover reports
	lostAt []int                      // delivery of each report
	// flagged are stops stamped before their start: merged as ended at
	// their start, then dead-lettered for audit.
	flagged []flaggedStop
}

type flaggedStop struct {
	delivery int
	ref      ledger.SegmentRef
	err      error
}

// HandleRentals handles a batch of rental events (the RENTALS consumer's
// handler): it merges every scheduled/started/stopped event into its
// segment (one store call for the batch), closes the segments that have
// records to close (all records in one publish batch, all cursors in one
// store call), then handles failover reports one by one. It returns one
// error per delivery. Every step is idempotent (merges set the same
// fields, record ids are deterministic, cursors only move forward), so a
// batch redelivered in part or in whole after a crash changes nothing more.
func (m *Meter) HandleRentals(ctx context.Context, ds []bus.Delivery) []error {
	b := m.sortRentals(ds)
	if len(b.events) > 0 {
		states, err := m.store.MergeSegments(ctx, b.events)
		m.noteLost(err)
		segErr := map[ledger.SegmentRef]error{}
		if err == nil {
			m.noteParked(ctx, states)
			for i, e := range m.closeStates(ctx, states) {
				if e != nil {
					segErr[ledger.SegmentRef{RentalID: states[i].RentalID, Attempt: states[i].Attempt}] = e
				}
			}
		}
		for j, i := range b.merged {
			if err != nil {
				b.out[i] = err
			} else {
				b.out[i] = segErr[b.events[j].Ref]
			}
		}
	}
	for _, f := range b.flagged {
		if b.out[f.delivery] == nil {
			// Merged and closed: the run is ended; the copy is for audit.
			m.metrics.steppedStops.Add(ctx, 1)
			m.log.WarnContext(ctx, "stop stamped before its start: run ended at the last trusted time",
				"rental", f.ref.RentalID, "attempt", f.ref.Attempt, "err", f.err)
			b.out[f.delivery] = f.err
		}
	}
	for j, i := range b.lostAt {
		b.out[i] = m.onMigrating(ctx, b.lost[j])
	}
	return b.out
}

func (m *Meter) sortRentals(ds []bus.Delivery) rentalBatch {
	b := rentalBatch{out: make([]error, len(ds)), events: make([]ledger.SegmentEvent, 0, len(ds)), merged: make([]int, 0, len(ds))}
	for i, d := range ds {
		var ev ledger.SegmentEvent
		var err error
		switch d.Event {
		case eventScheduled:
			ev, err = m.scheduled(d)
		case eventStarted:
			ev, err = m.started(d)
		case eventStopped:
			var flag error
			if ev, flag, err = stopped(d); flag != nil {
				b.flagged = append(b.flagged, flaggedStop{delivery: i, ref: ev.Ref, err: flag})
			}
		case eventMigrating:
			var mig shizuv1.RentalMigrating
			if b.out[i] = decode(d, &mig); b.out[i] == nil {
				b.lostAt, b.lost = append(b.lostAt, i), append(b.lost, &mig)
			}
			continue
		case eventMigrated:
			b.out[i] = decode(d, &shizuv1.RentalMigrated{})
			continue
		case eventPreempted:
			b.out[i] = decode(d, &shizuv1.RentalPreempted{})
			continue
		default: // an event this consumer does not handle: dead-lettered
			b.out[i] = bus.Unhandled(d)
			continue
		}
		if err != nil {
			b.out[i] = err
			continue
		}
		b.events, b.merged = append(b.events, ev), append(b.merged, i)
	}
	return b
}

func (m *Meter) scheduled(d bus.Delivery) (ledger.SegmentEvent, error) {
	var ev shizuv1.RentalScheduled
	if err := decode(d, &ev); err != nil {
		return ledger.SegmentEvent{}, err
	}
	spec := ev.GetSpec()
	if _, err := m.cat.Type(ev.GetGpuModel()); err != nil {
		return ledger.SegmentEvent{}, fault.Invalid("rental %s: %w", ev.GetRentalId(), err)
	}
	milli, err := m.cat.BillableMilli(ev.GetGpuModel(), spec.GetMigProfile(), spec.GetMilliGpu())
	if err != nil {
		return ledger.SegmentEvent{}, fault.Invalid("rental %s: %w", ev.GetRentalId(), err)
	}
	st := ledger.SegmentState{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt(), Scheduled: true,
		TenantID: ev.GetTenantId(), NodeID: ev.GetNodeId(), Plan: spec.GetPlan(), Model: ev.GetGpuModel(),
		Zone: ev.GetZone(), GPUCount: spec.GetGpuCount(), MilliGPU: milli, Labels: spec.GetLabels()}
	if mx := spec.GetMaxSpotPricePerGpuHour(); mx != nil {
		if mx.GetCurrency() != m.cat.Currency {
			return ledger.SegmentEvent{}, fault.Invalid("rental %s: max spot price in %s, the catalogue prices in %s", ev.GetRentalId(), mx.GetCurrency(), m.cat.Currency)
		}
		p := pricing.FromProto(mx)
		st.MaxSpot = &p
	}
	return ledger.ScheduledEvent(st), nil
}

func (m *Meter) started(d bus.Delivery) (ledger.SegmentEvent, error) {
	var ev shizuv1.RentalStarted
	if err := decode(d, &ev); err != nil {
		return ledger.SegmentEvent{}, err
	}
	ref := ledger.SegmentRef{RentalID: ev.GetRentalId(), Attempt: ev.GetAttempt()}
	at := ev.GetStartedAt().AsTime()
	// The closer first looks at it when its first interval can close.
	return ledger.StartedEvent(ref, ev.GetNodeId(), at, ledger.NextBoundary(at, m.rules.Interval).Add(m.grace)), nil
}

// stopped is a stop's change (ledger.TrustedStop). A stop stamped before
// its start also returns flag, the invalid-input error its delivery is
// dead-lettered with once the change is merged: the run is ended, and the
// stop is kept for audit with the reason.
func stopped(d bus.Delivery) (ev ledger.SegmentEvent, flag error, err error) {
	var msg shizuv1.RentalStopped
	if err := proto.Unmarshal(d.Data, &msg); err != nil {
		return ev, nil, fault.Invalid("decode %s: %w", d.Event, err)
	}
	ref := ledger.SegmentRef{RentalID: msg.GetRentalId(), Attempt: msg.GetAttempt()}
	start, stop := msg.GetStartedAt().AsTime(), msg.GetStoppedAt().AsTime()
	ev, stepped := ledger.TrustedStop(ref, start, stop, msg.GetExitReason())
	check := &msg
	if stepped && msg.GetStartedAt() != nil {
		// Everything else about the stop must still be valid.
		check = proto.CloneOf(&msg)
		check.StoppedAt = msg.GetStartedAt()
	}
	if err := check.Validate(); err != nil {
		return ev, nil, fault.Invalid("validate %s: %w", d.Event, err)
	}
	if stepped {
		flag = fault.Invalid("rental %s attempt %d: stopped_at %s is before started_at %s (a clock step on node %s?): "+
			"the run is ended at its start or at what was already billed, whichever is later",
			ref.RentalID, ref.Attempt, stop.Format(time.RFC3339Nano), start.Format(time.RFC3339Nano), msg.GetNodeId())
	}
	return ev, flag, nil
}

func (m *Meter) onMigrating(ctx context.Context, ev *shizuv1.RentalMigrating) error {
	last := ev.GetMeta().GetOccurredAt().AsTime()
	if hb := ev.GetLastHeartbeatAt(); hb != nil {
		last = hb.AsTime()
	}
	attempts, err := m.store.Attempts(ctx, ev.GetRentalId())
	if err != nil {
		return err
	}
	refs := make([]ledger.SegmentRef, len(attempts))
	for i, a := range attempts {
		refs[i] = ledger.SegmentRef{RentalID: ev.GetRentalId(), Attempt: a}
	}
	attempt := ev.GetFromAttempt()
	if attempt == 0 {
		states, err := m.store.MergeSegments(ctx, loads(refs))
		if err != nil {
			return err
		}
		attempt = ledger.LostAttempt(states, ev.GetFromNodeId())
	}
	if err := m.store.Lost(ctx, ev.GetRentalId(), attempt, last); err != nil {
		return err
	}
	// The lost placement may have become known since its attempts were
	// read (its events merged meanwhile): close it too, or nothing would
	// before the closer's next look.
	if !slices.Contains(attempts, attempt) {
		refs = append(refs, ledger.SegmentRef{RentalID: ev.GetRentalId(), Attempt: attempt})
	}
	return errors.Join(m.closeSegments(ctx, refs)...)
}

// loads are the events that only load refs.
func loads(refs []ledger.SegmentRef) []ledger.SegmentEvent {
	evs := make([]ledger.SegmentEvent, len(refs))
	for i, r := range refs {
		evs[i] = ledger.SegmentEvent{Ref: r}
	}
	return evs
}

// HandleSpotPrice records a spot price change (the MARKET consumer's
// handler).
func (m *Meter) HandleSpotPrice(ctx context.Context, ev *shizuv1.SpotPriceChanged, _ bus.Delivery) error {
	zone, model, p, err := m.spotPoint(ev)
	if err != nil {
		return err
	}
	return m.store.SpotPrice(ctx, zone, model, p)
}

// spotPoint is the price point a spot price change records, checked
// against the catalogue (invalid input when it cannot be billed by).
func (m *Meter) spotPoint(ev *shizuv1.SpotPriceChanged) (zone, model string, p ledger.PricePoint, err error) {
	if _, err := m.cat.Type(ev.GetModel()); err != nil {
		return "", "", p, fault.Invalid("spot price: %w", err)
	}
	price := pricing.FromProto(ev.GetPricePerGpuHour())
	if price.Currency != m.cat.Currency {
		return "", "", p, fault.Invalid("spot price of %s in %s is in %s, the catalogue prices in %s", ev.GetModel(), ev.GetZone(), price.Currency, m.cat.Currency)
	}
	if price.Micros < 0 || price.Micros > pricing.MaxPriceMicros {
		return "", "", p, fault.Invalid("spot price %d micros is outside 0..%d", price.Micros, int64(pricing.MaxPriceMicros))
	}
	return ev.GetZone(), ev.GetModel(), ledger.PricePoint{At: ev.GetEffectiveAt().AsTime(), Price: price}, nil
}
