package app

import (
	"context"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// releases is what the moves need of the capacity store: the old
// allocations released (break) or handed over (make-before-break). Its
// contract suite is failovertest.RunReleasesContract.
type releases interface {
	// HandOver marks the rental's allocation on the node its previous
	// run's (idempotent); fault.ErrNotFound when the node holds none.
	HandOver(ctx context.Context, rental, node string) (capacity.Allocation, error)
	// ReleaseOn gives back what the node holds of the rentals (live or
	// handed over) and reports which it released.
	ReleaseOn(ctx context.Context, node string, rentals ...string) ([]bool, error)
}

// queueMoves plans a failure's moves (migrate.PlanMoves), records and
// queues them, reading and writing the records of all of them in a few
// pipelined round trips.
func (f *Failover) queueMoves(ctx context.Context, allocs []migrate.Allocation, o migrate.Order) error {
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		ids[i] = a.Rental
	}
	placements, err := f.placements.GetMany(ctx, ids)
	if err != nil {
		return err
	}
	prevs, err := f.moves.GetMany(ctx, ids)
	if err != nil {
		return err
	}
	if err := f.recordsIntact(ctx); err != nil {
		return err // the sweep finds the node's rentals again (moveOrphans)
	}
	p := migrate.PlanMoves(allocs, placements, prevs, o)
	if err := f.moves.PutMany(ctx, p.Moves); err != nil {
		return err
	}
	if err := f.moves.UpdateMany(ctx, p.Revised); err != nil {
		return err
	}
	if len(p.Release) > 0 {
		if _, err := f.releases.ReleaseOn(ctx, o.Node, p.Release...); err != nil {
			return err
		}
	}
	moves := make([]migrate.Move, len(p.Moves))
	for i, m := range p.Moves {
		moves[i] = m.Move()
	}
	f.push(moves...)
	f.kick()
	return nil
}

// handOver is a batch of moves on its way to the scheduler: planned
// (publishable or not), executed (the old allocations released or handed
// over, the old runs told to stop), published, then recorded.
type handOver struct {
	// ready: moves whose events can go out, with the subject of their
	// RentalMigrating.
	ready []readyMove
	// failed: moves that can never go out (invalid input), recorded as
	// failed; their rental stays on its old node.
	failed []migrate.Record
	// gone: make-before-break moves whose rental stopped meanwhile.
	gone []string
	// published: moves whose RentalMigrating is in the batch.
	published []migrate.Record
}

type readyMove struct {
	m    migrate.Record
	subj string
}

// planHandOver sets aside the moves that can never be published (a tenant
// or node id that is no subject token), before anything of them is
// released.
func planHandOver(ms []migrate.Record) handOver {
	var h handOver
	for _, m := range ms {
		subj, err := subject.Format(subject.RentalMigrating, m.Tenant)
		if err == nil && m.StopOld && m.FromAttempt > 0 {
			_, err = subject.Format(subject.AgentCmd, m.FromNode, "stop")
		}
		if err != nil {
			m.Failed = err.Error()
			h.failed = append(h.failed, m)
			continue
		}
		h.ready = append(h.ready, readyMove{m: m, subj: subj})
	}
	return h
}

// fail sets m aside: it can never be handed over.
func (f *Failover) fail(ctx context.Context, h *handOver, m migrate.Record, err error) {
	m.Failed = err.Error()
	h.failed = append(h.failed, m)
	f.reportFailed(ctx, m)
}

// reportFailed logs and counts a move that can never be handed over.
func (f *Failover) reportFailed(ctx context.Context, m migrate.Record) {
	f.d.Log.ErrorContext(ctx, "a rental cannot be moved; it is left on its old node, recorded as failed", "rental", m.Rental,
		"tenant", m.Tenant, "node", m.FromNode, "err", m.Failed)
	f.d.Metrics.moveFailed(ctx, shizuv1.MigrationReason(m.Reason).String())
}

// moveAll hands rentals to the scheduler, all at once: stop the old runs
// that must stop, release (break) or hand over (make-before-break) the
// old allocations, publish every RentalMigrating, then wait once for
// every ack in b (with whatever the caller queued there) and mark the
// moves handed over. The records and the break releases take a few
// pipelined Redis round trips whatever the number of rentals; each
// make-before-break adds one (its capacity hand-over). A move that can
// never go out (invalid input: a tenant or node id that is no subject
// token, a rental id the store refuses) is set aside before anything of
// it is released, recorded as failed and counted; the others proceed. A
// store or bus failure returns, leaving the records unpublished for the
// sweep; every step is idempotent and every event has a fixed id, so the
// retry is deduplicated.
func (f *Failover) moveAll(ctx context.Context, ms []migrate.Record, b eventBatch) error {
	if len(ms) == 0 {
		if b.Len() > 0 {
			return b.Wait(ctx)
		}
		return nil
	}
	h := planHandOver(ms)
	for _, m := range h.failed {
		f.reportFailed(ctx, m)
	}
	ids := make([]string, len(h.ready))
	for i, r := range h.ready {
		ids[i] = r.m.Rental
	}
	placements, err := f.placements.GetMany(ctx, ids)
	if err != nil {
		return err
	}
	if err := f.recordsIntact(ctx); err != nil {
		f.push(movesOf(ms)...) // handed over once the records are back
		return err
	}
	out, err := f.releaseOld(ctx, &h, b)
	if err != nil {
		return err
	}
	if err := f.publishMoves(ctx, &h, out, placements, b); err != nil {
		return err
	}
	return f.settle(ctx, &h, b)
}

// releaseOld frees what the moved runs held: a make-before-break move
// hands its allocation over (the old run keeps it, out of the rental
// index, until it stops, so the new attempt can be reserved next to it),
// the old runs that must stop are told to (into b), and the allocations of
// break moves are released, per node in one call. It returns the moves to
// publish.
func (f *Failover) releaseOld(ctx context.Context, h *handOver, b eventBatch) ([]readyMove, error) {
	breaks := map[string][]string{} // node -> rentals whose allocation there is released
	var out []readyMove
	for _, r := range h.ready {
		m := r.m
		switch m.Mode {
		case migrate.ModeBreak:
			breaks[m.FromNode] = append(breaks[m.FromNode], m.Rental)
		case migrate.ModeMakeBeforeBreak:
			_, err := f.releases.HandOver(ctx, m.Rental, m.FromNode)
			switch {
			case err == nil, capacity.IsConflict(err): // handed over, or the rental lives elsewhere already
			case capacity.IsNotFound(err):
				h.gone = append(h.gone, m.Rental) // it stopped meanwhile: nothing to move
				continue
			case fault.IsInvalid(err):
				f.fail(ctx, h, m, err)
				continue
			default:
				return nil, err
			}
		}
		if m.StopOld && m.FromAttempt > 0 {
			if err := f.stopRun(ctx, b, m, shizuv1.ExitReason_EXIT_REASON_NODE_FAILED); err != nil {
				if fault.IsInvalid(err) { // its subject was checked: only the event itself
					f.fail(ctx, h, m, err)
					continue
				}
				return nil, err
			}
		}
		out = append(out, r)
	}
	for node, rentals := range breaks {
		if _, err := f.releases.ReleaseOn(ctx, node, rentals...); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// publishMoves puts every move's RentalMigrating into b; one that the bus
// refuses as invalid fails alone.
func (f *Failover) publishMoves(ctx context.Context, h *handOver, out []readyMove, placements map[string]migrate.Placement,
	b eventBatch) error {
	h.published = make([]migrate.Record, 0, len(out))
	for _, r := range out {
		pl, known := placements[r.m.Rental]
		if !known {
			f.d.Log.ErrorContext(ctx, "moving a rental failover never saw scheduled; the scheduler gets no spec", "rental", r.m.Rental)
		}
		if err := b.Publish(ctx, r.subj, rentalMigrating(r.m, pl, known, f.d.Source)); err != nil {
			if fault.IsInvalid(err) {
				f.fail(ctx, h, r.m, err)
				continue
			}
			return err
		}
		h.published = append(h.published, r.m)
	}
	return nil
}

// settle records the outcome: the failed first (a bus failure in the wait
// must not send them back to the sweep), then, once every ack is in, the
// published as handed over, and the gone dropped.
func (f *Failover) settle(ctx context.Context, h *handOver, b eventBatch) error {
	if err := f.moves.UpdateMany(ctx, h.failed); err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	for i := range h.published {
		f.d.Metrics.migrating(ctx, shizuv1.MigrationReason(h.published[i].Reason).String())
		h.published[i].Published = true
	}
	if err := f.moves.UpdateMany(ctx, h.published); err != nil {
		return err
	}
	for _, id := range h.gone {
		if err := f.moves.Drop(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// movesOf are the queue entries of ms.
func movesOf(ms []migrate.Record) []migrate.Move {
	out := make([]migrate.Move, len(ms))
	for i, m := range ms {
		out[i] = m.Move()
	}
	return out
}
