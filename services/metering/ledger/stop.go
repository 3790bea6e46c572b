package ledger

import (
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// TrustedStop is the change a RentalStopped stamped startedAt..stoppedAt
// makes, and whether its stamps contradict each other (stepped).
//
// A stop stamped before its start is what a node whose wall clock stepped
// back during the run reports. Neither stamp of the stop says when the run
// really ended (its occurred_at is the same stepped clock), and billing it
// as still running would bill it forever. So the run is ended at the last
// time metering trusts: its start, which a segment's cursor already past
// it overrides (the records already published stand, End is before the
// cursor, so the segment is finished at the cursor). That is, the run ends
// at max(started_at, what was already billed): nothing billed is lost or
// billed twice, and the seconds after the last closed record are not
// billed, since no trusted time says how many there were. The top-up to
// the minimum charge still applies to a run the tenant ended that was not
// billed yet: the tenant owes at least that much however long it ran.
func TrustedStop(ref SegmentRef, startedAt, stoppedAt time.Time, reason shizuv1.ExitReason) (ev SegmentEvent, stepped bool) {
	if stoppedAt.Before(startedAt) {
		return StoppedEvent(ref, startedAt, startedAt, reason), true
	}
	return StoppedEvent(ref, startedAt, stoppedAt, reason), false
}
