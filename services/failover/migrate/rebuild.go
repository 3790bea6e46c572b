package migrate

import (
	"slices"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Records is what failover's records hold again after they were lost
// (Redis restarted empty), recomputed from the rental stream in stream
// order: each rental's latest placement (its RentalScheduled with the
// highest attempt, forgotten when that attempt stopped, as the live
// handlers keep it) and the moves handed to the scheduler and not
// completed yet (a RentalMigrating with no start of its next attempt and
// no RentalMigrated after it), so a node lost after the loss still moves
// its rentals with their specs and attempts, and a move in flight is
// completed by its start (its RentalMigrated published, the old run of a
// make-before-break move stopped). Moves recorded but never published are
// not on the stream and are not rebuilt (docs/failover.md).
type Records struct {
	placements map[string]Placement
	moves      map[string]Record
	// starts are the starts of moves' next attempts, by rental.
	starts map[string]*shizuv1.RentalStarted
}

// NewRecords is an empty rebuild.
func NewRecords() *Records {
	return &Records{placements: map[string]Placement{}, moves: map[string]Record{}, starts: map[string]*shizuv1.RentalStarted{}}
}

// Scheduled folds a RentalScheduled in: the placement is kept unless a
// newer attempt is; a move to that attempt is scheduled.
func (r *Records) Scheduled(rental string, p Placement) {
	if cur, ok := r.placements[rental]; !ok || cur.Attempt <= p.Attempt {
		r.placements[rental] = p
	}
	if m, ok := r.moves[rental]; ok && m.NextAttempt > 0 && p.Attempt >= m.NextAttempt {
		m.Scheduled = true
		r.moves[rental] = m
	}
}

// Started folds a RentalStarted in: a start of a move's next attempt is
// what completes the move (Completions). The move stays recorded until its
// RentalMigrated, which the live handler publishes before it drops the
// record: a start it handled while the records were lost found no move and
// completed nothing.
func (r *Records) Started(ev *shizuv1.RentalStarted) {
	if m, ok := r.moves[ev.GetRentalId()]; ok && m.NextAttempt > 0 && ev.GetAttempt() >= m.NextAttempt {
		if _, seen := r.starts[ev.GetRentalId()]; !seen {
			r.starts[ev.GetRentalId()] = ev
		}
	}
}

// Stopped folds a RentalStopped in: the placement is forgotten when it is
// that attempt's.
func (r *Records) Stopped(rental string, attempt int32) {
	if cur, ok := r.placements[rental]; ok && cur.Attempt == attempt {
		delete(r.placements, rental)
	}
}

// Migrating folds a RentalMigrating in: the move it handed to the
// scheduler, published and waiting for its next attempt's start.
func (r *Records) Migrating(ev *shizuv1.RentalMigrating) {
	mode := ModeBreak
	if ev.GetReason() == shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION {
		mode = ModeMakeBeforeBreak
	}
	var last time.Time
	if hb := ev.GetLastHeartbeatAt(); hb != nil {
		last = hb.AsTime()
	}
	m := Record{Rental: ev.GetRentalId(), Tenant: ev.GetTenantId(), FromNode: ev.GetFromNodeId(), FromEpoch: uint64(ev.GetFromNodeEpoch()),
		FromAttempt: ev.GetFromAttempt(), NextAttempt: ev.GetNextAttempt(), Reason: int32(ev.GetReason()), Mode: mode,
		LastAlive: last, LastBeat: last, DecidedAt: ev.GetMeta().GetOccurredAt().AsTime(), Cause: ev.GetMeta().GetCausationId(),
		Published: true, Class: ClassUnknown}
	if p, ok := r.placements[m.Rental]; ok {
		m.Class, m.Priority = rent.ClassOf(p.Spec.GetPlan()), int(p.Spec.GetPriority())
	}
	if prev, ok := r.moves[m.Rental]; ok && prev.NextAttempt > m.NextAttempt && m.NextAttempt > 0 {
		return // an older move's redelivered notice
	}
	r.moves[m.Rental] = m
	delete(r.starts, m.Rental)
}

// Migrated folds a RentalMigrated in: the move to that attempt is done.
func (r *Records) Migrated(rental string, attempt int32) {
	if m, ok := r.moves[rental]; ok && (m.NextAttempt == 0 || attempt >= m.NextAttempt) {
		delete(r.moves, rental)
		delete(r.starts, rental)
	}
}

// Completions are the starts of moves whose next attempt started with no
// RentalMigrated after it: handing each to the live start handler
// completes its move (idempotent: the stop command and the RentalMigrated
// have fixed ids).
func (r *Records) Completions() []*shizuv1.RentalStarted {
	out := make([]*shizuv1.RentalStarted, 0, len(r.starts))
	for _, m := range r.Moves() {
		if ev, ok := r.starts[m.Rental]; ok {
			out = append(out, ev)
		}
	}
	return out
}

// Placements are the rebuilt placements, by rental.
func (r *Records) Placements() map[string]Placement { return r.placements }

// Moves are the rebuilt moves in flight, by rental id.
func (r *Records) Moves() []Record {
	out := make([]Record, 0, len(r.moves))
	for _, m := range r.moves {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Record) int {
		switch {
		case a.Rental < b.Rental:
			return -1
		case a.Rental > b.Rental:
			return 1
		}
		return 0
	})
	return out
}
