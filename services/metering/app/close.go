package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// CloseDue reads the watermark, then closes every segment whose next
// interval boundary has passed it and the clock, less the grace (up to
// 10,000 a call, in batches of the consumers' batch size), and returns how
// many it looked at. When the watermark cannot be read it closes up to the
// last one read, and says why.
func (m *Meter) CloseDue(ctx context.Context) (int, error) {
	var errs []error
	if m.consumed.bounded() {
		if err := m.consumed.refresh(ctx); err != nil {
			errs = append(errs, err)
		}
		if at := m.consumed.time(); !at.IsZero() {
			m.metrics.lag.Record(ctx, max(m.now().Sub(at), 0).Seconds())
		}
	}
	refs, err := m.store.Due(ctx, m.cutoff(), 10_000)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	m.metrics.due.Add(ctx, int64(len(refs)))
	for chunk := range slices.Chunk(refs, max(m.batch, 1)) {
		for i, err := range m.closeSegments(ctx, chunk) {
			switch {
			case err == nil:
			case fault.IsInvalid(err):
				m.log.ErrorContext(ctx, "segment cannot be billed", "rental", chunk[i].RentalID, "attempt", chunk[i].Attempt, "err", err)
			default:
				errs = append(errs, err)
			}
		}
	}
	return len(refs), errors.Join(errs...)
}

// closeTick is the interval closer's loop body: CloseDue, logging a
// failure unless the loop is stopping.
func (m *Meter) closeTick(ctx context.Context, _ time.Time) {
	if _, err := m.CloseDue(ctx); err != nil && ctx.Err() == nil {
		m.log.WarnContext(ctx, "closing due usage failed", "err", err)
	}
}

// cutoff is ledger.Cutoff of the clock and the watermark: running rentals
// are billed up to it less the grace (docs/design/watermark.md).
func (m *Meter) cutoff() time.Time {
	return ledger.Cutoff(m.now(), m.consumed.time(), m.consumed.bounded())
}

// closeSegments loads segments and closes them (closeStates), returning
// one error per ref.
func (m *Meter) closeSegments(ctx context.Context, refs []ledger.SegmentRef) []error {
	errs := make([]error, len(refs))
	states, err := m.store.MergeSegments(ctx, loads(refs))
	if err != nil {
		m.noteLost(err)
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	byRef := map[ledger.SegmentRef]error{}
	for i, e := range m.closeStates(ctx, states) {
		byRef[ledger.SegmentRef{RentalID: states[i].RentalID, Attempt: states[i].Attempt}] = e
	}
	for i, r := range refs {
		errs[i] = byRef[r]
	}
	return errs
}

// closing is what a close of some segments publishes and commits.
type closing struct {
	errs        []error // one per segment
	batch       PublishBatch
	published   []ledger.Record
	withRecords []int // segments with records in the batch
	advances    []ledger.Advance
	advanced    []int // segment of each advance
}

// closeStates publishes every record of the segments closed now (one
// publish batch), then advances their cursors (one store call), and
// returns one error per state (docs/design/publish-then-fold.md).
func (m *Meter) closeStates(ctx context.Context, states []ledger.SegmentState) []error {
	c := closing{errs: make([]error, len(states)), batch: m.pub.NewBatch(),
		advances: make([]ledger.Advance, 0, len(states)), advanced: make([]int, 0, len(states))}
	cutoff := m.cutoff()
	until := cutoff.Add(-m.grace)
	for i, st := range states {
		if ledger.ParkingOf(st, cutoff, m.parkGrace) == ledger.GiveUp {
			c.errs[i] = m.giveUp(ctx, st)
			continue
		}
		m.queue(ctx, &c, i, st, until)
	}
	if c.batch.Len() > 0 {
		if err := c.batch.Wait(ctx); err != nil {
			c.unpublished(fmt.Errorf("publish usage: %w", err))
		}
		for _, r := range c.published {
			m.metrics.published(ctx, r.Plan.String(), r.Amount.Currency, r.Amount.Micros)
		}
	}
	if err := m.store.AdvanceAll(ctx, c.advances); err != nil {
		for _, i := range c.advanced {
			c.errs[i] = err
		}
	}
	return c.errs
}

// queue plans the close of segment i and queues its records and advance.
func (m *Meter) queue(ctx context.Context, c *closing, i int, st ledger.SegmentState, until time.Time) {
	recs, adv, ok, err := m.plan(ctx, st, until)
	if err != nil {
		c.errs[i] = err
		return
	}
	for _, r := range recs {
		subj, err := subject.Format(subject.UsageRecorded, r.TenantID)
		if err == nil {
			err = c.batch.Publish(ctx, subj, r.Proto(m.source))
		}
		if err != nil {
			c.errs[i] = fault.Invalid("rental %s: %w", st.RentalID, err)
			return
		}
	}
	if len(recs) > 0 {
		c.published = append(c.published, recs...)
		c.withRecords = append(c.withRecords, i)
	}
	if ok {
		c.advances, c.advanced = append(c.advances, adv), append(c.advanced, i)
	}
}

// unpublished fails every segment with records: which publish failed is
// not known, so none of them advances, and their events are redelivered.
func (c *closing) unpublished(err error) {
	for _, i := range c.withRecords {
		c.errs[i] = err
	}
	kept, keptIdx := c.advances[:0], c.advanced[:0]
	for j, a := range c.advances {
		if c.errs[c.advanced[j]] == nil {
			kept, keptIdx = append(kept, a), append(keptIdx, c.advanced[j])
		}
	}
	c.advances, c.advanced, c.published = kept, keptIdx, nil
}

// plan is what closing a segment now takes: its records and the advance of
// its cursor (ok false when the cursor stays). A running segment is billed
// up to until; an ended one (stopped, or lost in a failover) to its end.
func (m *Meter) plan(ctx context.Context, st ledger.SegmentState, until time.Time) (recs []ledger.Record, adv ledger.Advance, ok bool, err error) {
	ref := ledger.SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}
	seg, known := st.Segment()
	if st.Done || (known && st.Settled(m.rules)) {
		// Finished, its top-up included: nothing to bill; a stale due-list
		// member may still name it, so the advance takes it off.
		return nil, ledger.Advance{Ref: ref, Cursor: st.Cursor, Finished: true}, true, nil
	}
	if !known {
		return nil, adv, false, nil // stays due until its other events arrive
	}
	tariff, err := m.tariff(ctx, seg)
	if err != nil {
		return nil, adv, false, err
	}
	if seg.Ended() && until.Before(seg.End) {
		until = seg.End
	}
	recs, cursor, err := ledger.Close(seg, tariff, m.rules, st.Cursor, until)
	if err != nil {
		return nil, adv, false, fault.Invalid("rental %s attempt %d: %w", ref.RentalID, ref.Attempt, err)
	}
	m.aboveMax(ctx, seg, tariff, st.Cursor, cursor)
	if len(recs) == 0 && cursor.Equal(st.Cursor) && !seg.Ended() {
		return nil, adv, false, nil // nothing closed yet; the start already made it due
	}
	st.Cursor = cursor
	due := cursor
	if due.Before(seg.Start) {
		due = seg.Start
	}
	due = ledger.NextBoundary(due, m.rules.Interval).Add(m.grace)
	return recs, ledger.Advance{Ref: ref, Cursor: cursor, Due: due, Finished: st.Finished()}, true, nil
}

// aboveMax counts and logs the seconds of seg in [from, to) (what a close
// just took) that are not billed because the spot price was above the
// tenant's maximum: the rental runs unbilled until it is preempted.
func (m *Meter) aboveMax(ctx context.Context, seg ledger.Segment, tariff ledger.Tariff, from, to time.Time) {
	if n := ledger.SecondsAboveMax(seg, tariff, from, to); n > 0 {
		m.metrics.aboveMax.Add(ctx, n)
		m.log.WarnContext(ctx, "spot seconds priced above the tenant's maximum are not billed", "rental", seg.RentalID,
			"attempt", seg.Attempt, "node", seg.NodeID, "seconds", n, "max", seg.MaxSpot.String(), "from", from, "to", to)
	}
}

// tariff is what seg is priced at (ledger.TariffOf), with the spot history
// read up to its end.
func (m *Meter) tariff(ctx context.Context, seg ledger.Segment) (ledger.Tariff, error) {
	var spot []ledger.PricePoint
	if ledger.NeedsSpotHistory(seg) {
		var until time.Time
		if seg.Ended() {
			until = seg.End
		}
		var err error
		if spot, err = m.store.SpotPrices(ctx, seg.Zone, seg.Model, until); err != nil {
			return ledger.Tariff{}, err
		}
	}
	return ledger.TariffOf(m.cat, m.accounts, seg, spot)
}
