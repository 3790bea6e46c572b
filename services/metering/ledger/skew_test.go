package ledger_test

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

// A start stamped before its placement moves, with its stop, to the
// placement; a start stamped after it is taken as it is.
func TestAStartStampedBeforeItsPlacementIsBilledFromThePlacement(t *testing.T) {
	t.Parallel()
	placed := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name               string
		start, stop        time.Time
		wantStart, wantEnd time.Time
		wantSkew           time.Duration
	}{
		{"an hour behind, stopped", placed.Add(-time.Hour), placed.Add(-time.Hour + 90*time.Second), placed, placed.Add(90 * time.Second), time.Hour},
		{"an hour behind, running", placed.Add(-time.Hour), time.Time{}, placed, time.Time{}, time.Hour},
		{"after the placement", placed.Add(2 * time.Second), placed.Add(32 * time.Second), placed.Add(2 * time.Second), placed.Add(32 * time.Second), 0},
		{"at the placement", placed, placed.Add(time.Second), placed, placed.Add(time.Second), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := ledger.SegmentState{RentalID: "r", Attempt: 1, Scheduled: true, ScheduledAt: placed, TenantID: "t", GPUCount: 1, MilliGPU: 1000,
				StartedAt: c.start, StoppedAt: c.stop}
			if !c.stop.IsZero() {
				st.StoppedStartedAt, st.ExitReason = c.start, shizuv1.ExitReason_EXIT_REASON_COMPLETED
			}
			seg, ok := st.Segment()
			if !ok || !seg.Start.Equal(c.wantStart) || !seg.End.Equal(c.wantEnd) || st.Skew() != c.wantSkew {
				t.Fatalf("segment %v %s..%s skew %s; want %s..%s skew %s", ok, seg.Start, seg.End, st.Skew(), c.wantStart, c.wantEnd, c.wantSkew)
			}
		})
	}
	// Without the placement's time (a store written before it was kept),
	// the stamps are taken as they are.
	st := ledger.SegmentState{RentalID: "r", Attempt: 1, Scheduled: true, StartedAt: placed.Add(-time.Hour)}
	if st.Start() != placed.Add(-time.Hour) || st.Skew() != 0 {
		t.Fatalf("start %s skew %s without a placement time", st.Start(), st.Skew())
	}
}
