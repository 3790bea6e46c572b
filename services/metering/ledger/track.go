package ledger

import (
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

// SegmentState is what metering has learnt about one placement of a rental
// from its events, in whatever order they came (Merge is how each event
// changes it).
type SegmentState struct {
	RentalID string
	Attempt  int32

	// From RentalScheduled.
	Scheduled bool
	TenantID  string
	// NodeID is the schedule's node, or StartNode while it names none.
	NodeID   string
	Plan     shizuv1.Plan
	Model    string
	Zone     string
	GPUCount int32
	MilliGPU int32 // billable share (pricing.BillableMilli)
	Labels   map[string]string
	MaxSpot  *pricing.Money

	// StartNode is the node of the first RentalStarted.
	StartNode string
	// StartedAt is RentalStarted.started_at; StoppedStartedAt is
	// RentalStopped.started_at, which wins if both are known and differ.
	StartedAt        time.Time
	StoppedStartedAt time.Time
	// StoppedAt and ExitReason come from RentalStopped.
	StoppedAt  time.Time
	ExitReason shizuv1.ExitReason
	// LostAt is the last heartbeat of the node this placement was lost on
	// in a failover (RentalMigrating); billing ends there at the latest.
	LostAt time.Time

	// Cursor is the end of the last record published.
	Cursor time.Time
	// Done says every record has been published and the segment is closed.
	Done bool
}

// Start is the segment's billing start, if known.
func (s SegmentState) Start() time.Time {
	if !s.StoppedStartedAt.IsZero() {
		return s.StoppedStartedAt
	}
	return s.StartedAt
}

// End is the segment's billing end, if known: the earlier of the stop and
// the last heartbeat of the node it was lost on, so the dead interval of a
// failover is not billed. A node lost before its first heartbeat after the
// start bills nothing (the end is the start).
func (s SegmentState) End() time.Time {
	end := s.StoppedAt
	lost := s.LostAt
	if lost.IsZero() {
		return end
	}
	if start := s.Start(); !start.IsZero() && lost.Before(start) {
		lost = start
	}
	if end.IsZero() || lost.Before(end) {
		end = lost
	}
	return end
}

// Segment returns the billable segment, or false while metering does not
// yet know enough to bill it (no scheduling facts or no start).
func (s SegmentState) Segment() (Segment, bool) {
	start := s.Start()
	if !s.Scheduled || start.IsZero() {
		return Segment{}, false
	}
	end := s.End()
	tenantEnded := false
	if !s.StoppedAt.IsZero() && end.Equal(s.StoppedAt) {
		switch s.ExitReason {
		case shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_FAILED, shizuv1.ExitReason_EXIT_REASON_CANCELLED:
			tenantEnded = true
		}
	}
	return Segment{
		RentalID: s.RentalID, TenantID: s.TenantID, NodeID: s.NodeID, Attempt: s.Attempt, Plan: s.Plan,
		Model: s.Model, Zone: s.Zone, GPUCount: s.GPUCount, MilliGPU: s.MilliGPU, Labels: s.Labels,
		MaxSpot: s.MaxSpot, Start: start, End: end, TenantEnded: tenantEnded,
	}, true
}

// Finished reports whether every record of the segment has been published:
// its end is known and the cursor has passed it.
func (s SegmentState) Finished() bool {
	seg, ok := s.Segment()
	return ok && seg.Ended() && !s.Cursor.Before(seg.End)
}

// Settled reports whether every record of the segment has been published,
// the top-up to the minimum charge included: its end is known and the
// cursor has reached FinalCursor. A cursor at the end with the top-up
// still to publish (a store rebuilt from a billing stream that holds the
// run's records but not its top-up) is Finished but not Settled.
func (s SegmentState) Settled(rules Rules) bool {
	seg, ok := s.Segment()
	return ok && seg.Ended() && !s.Cursor.Before(FinalCursor(seg, rules))
}
