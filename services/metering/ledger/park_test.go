package ledger_test

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

func TestAPlacementWithoutItsScheduleIsParkedForTheGraceThenGivenUp(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	grace := 10 * time.Minute
	started := ledger.SegmentState{RentalID: "r", Attempt: 1, StartedAt: t0}
	stopped := ledger.SegmentState{RentalID: "r", Attempt: 1, StoppedStartedAt: t0, StoppedAt: t0.Add(time.Minute)}
	scheduled := started
	scheduled.Scheduled = true
	cases := []struct {
		name   string
		st     ledger.SegmentState
		cutoff time.Time
		want   ledger.Parking
	}{
		{"a scheduled placement is not parked", scheduled, t0.Add(time.Hour), ledger.NotParked},
		{"a placement with nothing merged is not parked", ledger.SegmentState{RentalID: "r", Attempt: 1}, t0.Add(time.Hour), ledger.NotParked},
		{"a start waits within the grace", started, t0.Add(grace - time.Nanosecond), ledger.Parked},
		{"a start is given up once the cutoff is the grace past it", started, t0.Add(grace), ledger.GiveUp},
		{"a stop waits the grace from its stop, not its start", stopped, t0.Add(grace), ledger.Parked},
		{"a stop is given up the grace after its stop", stopped, t0.Add(time.Minute + grace), ledger.GiveUp},
		{"a zero cutoff (no watermark read) gives up nothing", started, time.Time{}, ledger.Parked},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.ParkingOf(tc.st, tc.cutoff, grace); got != tc.want {
				t.Fatalf("ParkingOf = %d, want %d", got, tc.want)
			}
		})
	}
}
