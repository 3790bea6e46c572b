package ledger

import (
	"maps"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// This file is the segment merge rule: how the rental events of one
// placement, in any order and any number of times, build its SegmentState
// and its entry on the due list (the segments the closer looks at), and how
// a close advances both. The Redis adapter applies the same rule atomically
// in Lua (redisstore's merge and advance scripts); a test there runs both on
// the same inputs so they cannot drift.

// SegmentRef names one placement (attempt) of a rental.
type SegmentRef struct {
	RentalID string
	Attempt  int32
}

// Change is what a rental event changes in its segment.
type Change int

// The changes.
const (
	// ChangeNone changes nothing: merging it only loads the segment.
	ChangeNone Change = iota
	// ChangeScheduled sets the placement's pricing facts (RentalScheduled).
	ChangeScheduled
	// ChangeStarted records the start (RentalStarted): the first wins.
	ChangeStarted
	// ChangeStopped records the end (RentalStopped).
	ChangeStopped
)

// SegmentEvent is one rental event's change to a segment.
type SegmentEvent struct {
	Ref    SegmentRef
	Change Change
	// Facts are the pricing facts of ChangeScheduled: TenantID, NodeID,
	// Plan, Model, Zone, GPUCount, MilliGPU, Labels, MaxSpot.
	Facts SegmentState
	// Node is the node of ChangeStarted.
	Node string
	// StartedAt is the start of ChangeStarted and ChangeStopped (the
	// stop's started_at); StoppedAt and Exit are the end of ChangeStopped.
	StartedAt, StoppedAt time.Time
	Exit                 shizuv1.ExitReason
	// Due is when a start or a stop makes the segment due for closing.
	Due time.Time
}

// ScheduledEvent is the change RentalScheduled makes: st's pricing facts.
func ScheduledEvent(st SegmentState) SegmentEvent {
	return SegmentEvent{Ref: SegmentRef{RentalID: st.RentalID, Attempt: st.Attempt}, Change: ChangeScheduled, Facts: st}
}

// StartedEvent is the change RentalStarted makes: the start on node at at,
// due for its first close at due.
func StartedEvent(ref SegmentRef, node string, at, due time.Time) SegmentEvent {
	return SegmentEvent{Ref: ref, Change: ChangeStarted, Node: node, StartedAt: at, Due: due}
}

// StoppedEvent is the change RentalStopped makes: the end, due at once.
func StoppedEvent(ref SegmentRef, startedAt, stoppedAt time.Time, reason shizuv1.ExitReason) SegmentEvent {
	return SegmentEvent{Ref: ref, Change: ChangeStopped, StartedAt: startedAt, StoppedAt: stoppedAt, Exit: reason, Due: stoppedAt}
}

// RecordsAttempt says whether the event makes its attempt one of the
// rental's known placements (a failover report looks them up).
func (ev SegmentEvent) RecordsAttempt() bool {
	return ev.Change == ChangeScheduled || ev.Change == ChangeStarted
}

// DueEntry is a segment's place on the due list: listed, and when the
// closer should next look at it (stores keep it to the second).
type DueEntry struct {
	Listed bool
	At     time.Time
}

// Merge is the segment's state and due entry after ev. Each event sets its
// own fields only, so merging the same events in any order, or one twice,
// gives the same state:
//   - a schedule sets the pricing facts (a maximum spot price is kept once
//     known: an event without one does not clear it);
//   - a start sets the start and its node only while no start is known
//     (the first reported wins);
//   - a stop sets its started_at, the stop and the exit reason;
//   - the node is the schedule's, or the start's while the schedule names
//     none;
//   - a start or a stop lists the segment as due at ev.Due unless it is
//     listed already (the earlier entry stays), or, when the segment is
//     finished (Done), takes it off the list, so a redelivered start or stop
//     of a finished segment is not looked at on every tick forever.
func Merge(st SegmentState, due DueEntry, ev SegmentEvent) (SegmentState, DueEntry) {
	switch ev.Change {
	case ChangeNone:
		return st, due
	case ChangeScheduled:
		f := ev.Facts
		st.Scheduled = true
		if st.ScheduledAt.IsZero() {
			// The first schedule's time stays: a schedule published again
			// later (a redelivered request) is no later placement.
			st.ScheduledAt = f.ScheduledAt
		}
		st.TenantID, st.NodeID, st.Plan, st.Model, st.Zone = f.TenantID, f.NodeID, f.Plan, f.Model, f.Zone
		st.GPUCount, st.MilliGPU, st.Labels = f.GPUCount, f.MilliGPU, maps.Clone(f.Labels)
		if f.MaxSpot != nil {
			p := *f.MaxSpot
			st.MaxSpot = &p
		}
		if st.NodeID == "" {
			st.NodeID = st.StartNode
		}
		return st, due
	case ChangeStarted:
		if st.StartedAt.IsZero() {
			st.StartedAt, st.StartNode = ev.StartedAt, ev.Node
			if st.NodeID == "" {
				st.NodeID = ev.Node
			}
		}
	case ChangeStopped:
		st.StoppedStartedAt, st.StoppedAt, st.ExitReason = ev.StartedAt, ev.StoppedAt, ev.Exit
	}
	switch {
	case st.Done:
		due = DueEntry{}
	case !due.Listed:
		due = DueEntry{Listed: true, At: ev.Due}
	}
	return st, due
}

// Advance moves a segment's cursor forward (never back) and schedules its
// next closing at Due, or, when Finished, takes it off the due list.
type Advance struct {
	Ref      SegmentRef
	Cursor   time.Time
	Due      time.Time
	Finished bool
}

// Apply is the segment's state and due entry after a: the cursor moves only
// forward; a finished segment (Done) stays finished and off the due list,
// so a running advance that lands after the finishing one (the closer
// racing the stop's handler) does not list it again; otherwise the
// segment is due again at a.Due.
func (a Advance) Apply(st SegmentState, due DueEntry) (SegmentState, DueEntry) {
	if st.Cursor.IsZero() || a.Cursor.After(st.Cursor) {
		st.Cursor = a.Cursor
	}
	if a.Finished || st.Done {
		st.Done = true
		return st, DueEntry{}
	}
	return st, DueEntry{Listed: true, At: a.Due}
}

// EarliestLoss is the last heartbeat kept for a placement lost in a
// failover when another report says next: the earliest, so replays agree.
func EarliestLoss(kept, next time.Time) time.Time {
	if kept.IsZero() || next.Before(kept) {
		return next
	}
	return kept
}

// LostAttempt is the placement a failover report that did not name the
// attempt was about, of a rental's known placements: the latest one on the
// lost node that has not ended (else the latest one on that node). When no
// placement on that node is known yet (the report came before the rental's
// other events), it is the first.
func LostAttempt(placements []SegmentState, node string) int32 {
	var onNode, running int32
	for _, st := range placements {
		if st.NodeID != node {
			continue
		}
		onNode = max(onNode, st.Attempt)
		if st.StoppedAt.IsZero() && st.LostAt.IsZero() {
			running = max(running, st.Attempt)
		}
	}
	switch {
	case running > 0:
		return running
	case onNode > 0:
		return onNode
	}
	return 1
}

// Cutoff is the latest time running rentals may be billed up to (plus the
// close grace): now, held back to the watermark when the meter follows
// one (follows), so that a stop or a price change already on the bus is
// never billed past. The watermark is the stream time before which every
// rental and spot price event has been handled; zero (never read) holds
// billing back entirely.
func Cutoff(now, watermark time.Time, follows bool) time.Time {
	if follows && watermark.Before(now) {
		return watermark
	}
	return now
}
