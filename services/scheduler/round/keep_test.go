package round_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

func TestWhetherAReservationStaysAfterItsOutcomeClaim(t *testing.T) {
	t.Parallel()
	const mine, earlier = "n1@2000", "n1@1000"
	cases := []struct {
		name     string
		claim    round.Claim
		existing bool
		want     bool
	}{
		{"a claim that recorded the outcome keeps it", round.Claim{Outcome: round.OutcomeScheduled, Won: true, Alloc: mine}, false, true},
		{"a redelivery that finds its own reservation and its own announcement keeps it",
			round.Claim{Outcome: round.OutcomeScheduled, Alloc: mine}, true, true},
		{"a replica whose reservation another replica announced first keeps it",
			round.Claim{Outcome: round.OutcomeScheduled, Alloc: mine}, false, true},
		{"a fresh reservation after the announced one was released is given back",
			round.Claim{Outcome: round.OutcomeScheduled, Alloc: earlier}, false, false},
		{"an existing allocation other than the announced one is given back",
			round.Claim{Outcome: round.OutcomeScheduled, Alloc: earlier}, true, false},
		{"under an outcome that names no allocation an existing one stays",
			round.Claim{Outcome: round.OutcomeScheduled}, true, true},
		{"under an outcome that names no allocation a fresh one is given back",
			round.Claim{Outcome: round.OutcomeScheduled}, false, false},
		{"a rental cancelled first gives its reservation back, existing or not",
			round.Claim{Outcome: round.OutcomeCancelled}, true, false},
		{"a rental rejected first (its deadline passed) gives its reservation back",
			round.Claim{Outcome: round.OutcomeRejected}, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := round.KeepReservation(tc.claim, mine, tc.existing); got != tc.want {
				t.Fatalf("KeepReservation(%+v, %q, existing %v) = %v, want %v", tc.claim, mine, tc.existing, got, tc.want)
			}
		})
	}
}
