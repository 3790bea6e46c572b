package ledger

import (
	"slices"
	"time"
)

// This file recomputes what metering's store held from the streams, after
// the store was lost (Redis restarted empty): the rental stream's
// lifecycle events rebuild every placement's segment state and due entry
// through the same Merge the live consumer applies, failover reports
// rebuild the losses (EarliestLoss, LostAttempt), and the usage records
// already on the billing stream rebuild each segment's cursor (the end of
// the last record published), so closing again continues exactly where
// billing stopped: no record is published twice and none is missed.

// Replay folds the events of the streams, in stream order, into segment
// states. The zero value is not ready: use NewReplay.
type Replay struct {
	segs  map[SegmentRef]*replayed
	order []SegmentRef
	// attempts are the known placements of each rental (RecordsAttempt).
	attempts map[string][]int32
	// lost is the earliest loss reported per rental and attempt.
	lost map[string]map[int32]time.Time
	// billed are the usage records on the billing stream, per rental.
	billed map[string][]BilledRecord
}

type replayed struct {
	st  SegmentState
	due DueEntry
}

// BilledRecord is what the cursor rebuild needs of a usage record already
// on the billing stream.
type BilledRecord struct {
	RentalID, NodeID string
	Start, End       time.Time
}

// LossMark is a failover loss to restore: the last heartbeat of the node a
// rental's placement was lost on.
type LossMark struct {
	RentalID      string
	Attempt       int32
	LastHeartbeat time.Time
}

// Restored is a segment as the store must hold it again.
type Restored struct {
	State SegmentState
	Due   DueEntry
	// Known says the attempt is one of the rental's known placements.
	Known bool
}

// NewReplay is an empty replay.
func NewReplay() *Replay {
	return &Replay{segs: map[SegmentRef]*replayed{}, attempts: map[string][]int32{},
		lost: map[string]map[int32]time.Time{}, billed: map[string][]BilledRecord{}}
}

// Merge folds one lifecycle event's change in (Merge).
func (r *Replay) Merge(ev SegmentEvent) {
	if ev.Change == ChangeNone {
		return
	}
	s, ok := r.segs[ev.Ref]
	if !ok {
		s = &replayed{st: SegmentState{RentalID: ev.Ref.RentalID, Attempt: ev.Ref.Attempt}}
		r.segs[ev.Ref] = s
		r.order = append(r.order, ev.Ref)
	}
	s.st, s.due = Merge(s.st, s.due, ev)
	if ev.RecordsAttempt() && !slices.Contains(r.attempts[ev.Ref.RentalID], ev.Ref.Attempt) {
		r.attempts[ev.Ref.RentalID] = append(r.attempts[ev.Ref.RentalID], ev.Ref.Attempt)
	}
}

// Lost folds a failover report in: the placement on node (attempt, or when
// the report names none, LostAttempt of the placements known so far) ended
// at lastHeartbeat at the latest (EarliestLoss). It returns the attempt.
func (r *Replay) Lost(rental, node string, attempt int32, lastHeartbeat time.Time) int32 {
	if attempt == 0 {
		known := make([]SegmentState, 0, len(r.attempts[rental]))
		for _, a := range r.attempts[rental] {
			st := SegmentState{RentalID: rental, Attempt: a}
			if s, ok := r.segs[SegmentRef{RentalID: rental, Attempt: a}]; ok {
				st = s.st
			}
			st.LostAt = r.lost[rental][a]
			known = append(known, st)
		}
		attempt = LostAttempt(known, node)
	}
	if r.lost[rental] == nil {
		r.lost[rental] = map[int32]time.Time{}
	}
	r.lost[rental][attempt] = EarliestLoss(r.lost[rental][attempt], lastHeartbeat)
	return attempt
}

// Billed notes a usage record already on the billing stream.
func (r *Replay) Billed(rec BilledRecord) {
	r.billed[rec.RentalID] = append(r.billed[rec.RentalID], rec)
}

// Losses are the failover losses to restore, by rental and attempt.
func (r *Replay) Losses() []LossMark {
	var out []LossMark
	for rental, byAttempt := range r.lost {
		for a, at := range byAttempt {
			out = append(out, LossMark{RentalID: rental, Attempt: a, LastHeartbeat: at})
		}
	}
	slices.SortFunc(out, func(a, b LossMark) int {
		if a.RentalID != b.RentalID {
			if a.RentalID < b.RentalID {
				return -1
			}
			return 1
		}
		return int(a.Attempt - b.Attempt)
	})
	return out
}

// Segments are the segments as the store must hold them again, in the
// order their first events came: each with its losses, its cursor at the
// end of the last record of it on the billing stream (CursorOf), and that
// cursor applied as the close that published it would have applied it
// (Advance.Apply: a finished segment is done and off the due list, a
// running one due at its next boundary plus grace).
func (r *Replay) Segments(rules Rules, grace time.Duration) []Restored {
	out := make([]Restored, 0, len(r.order))
	cursors := r.cursors()
	for _, ref := range r.order {
		s := r.segs[ref]
		st, due := s.st, s.due
		st.LostAt = r.lost[ref.RentalID][ref.Attempt]
		if c, ok := cursors[ref]; ok {
			st.Cursor = c
			from := c
			if start := st.Start(); from.Before(start) {
				from = start
			}
			adv := Advance{Ref: ref, Cursor: c, Due: NextBoundary(from, rules.Interval).Add(grace), Finished: st.Settled(rules)}
			st, due = adv.Apply(st, due)
		}
		out = append(out, Restored{State: st, Due: due, Known: slices.Contains(r.attempts[ref.RentalID], ref.Attempt)})
	}
	return out
}

// cursors is CursorOf for every rental's billed records.
func (r *Replay) cursors() map[SegmentRef]time.Time {
	out := map[SegmentRef]time.Time{}
	for rental, recs := range r.billed {
		var segs []SegmentState
		for _, a := range r.attempts[rental] {
			if s, ok := r.segs[SegmentRef{RentalID: rental, Attempt: a}]; ok {
				segs = append(segs, s.st)
			}
		}
		for ref, c := range CursorOf(segs, recs) {
			out[ref] = c
		}
	}
	return out
}

// CursorOf rebuilds the cursors of one rental's placements from its usage
// records on the billing stream: a segment's cursor is the latest end of
// the records that belong to it. Records name no attempt, so a record
// belongs to the placement on its node that started last at or before the
// record's start (placements of one rental do not overlap in time: their
// record ids, which carry only the rental and the start, would collide);
// when no placement on its node started by then, to the earliest one on
// its node; when none is on its node, by the same rule among them all. A
// record that belongs to no started placement is ignored.
func CursorOf(placements []SegmentState, recs []BilledRecord) map[SegmentRef]time.Time {
	out := map[SegmentRef]time.Time{}
	for _, rec := range recs {
		st, ok := owner(placements, rec)
		if !ok {
			continue
		}
		ref := SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}
		if c, ok := out[ref]; !ok || rec.End.After(c) {
			out[ref] = rec.End
		}
	}
	return out
}

func owner(placements []SegmentState, rec BilledRecord) (SegmentState, bool) {
	var onNode []SegmentState
	for _, st := range placements {
		if !st.Start().IsZero() && st.NodeID == rec.NodeID {
			onNode = append(onNode, st)
		}
	}
	if len(onNode) == 0 {
		for _, st := range placements {
			if !st.Start().IsZero() {
				onNode = append(onNode, st)
			}
		}
	}
	var best, earliest SegmentState
	var found, any bool
	for _, st := range onNode {
		start := st.Start()
		if !start.After(rec.Start) && (!found || start.After(best.Start())) {
			best, found = st, true
		}
		if !any || start.Before(earliest.Start()) {
			earliest, any = st, true
		}
	}
	if found {
		return best, true
	}
	return earliest, any
}
