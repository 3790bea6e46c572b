package failovertest_test

import (
	"errors"
	"testing"

	"github.com/shizu-gpu/shizu/services/failover/app/failovertest"
	"github.com/shizu-gpu/shizu/shared/fault"
)

func TestTheFakePlacementsKeepTheContract(t *testing.T) {
	failovertest.RunPlacementRecordsContract(t, func(*testing.T) failovertest.PlacementRecords { return failovertest.NewPlacements() })
}

func TestTheFakeMovesKeepTheContract(t *testing.T) {
	failovertest.RunMoveRecordsContract(t, func(*testing.T) failovertest.MoveRecords { return failovertest.NewMoves() })
}

func TestTheFakeQuarantinesKeepTheContract(t *testing.T) {
	failovertest.RunQuarantineRecordsContract(t, func(*testing.T) failovertest.QuarantineRecords { return failovertest.NewQuarantines() })
}

func TestTheFakeBusKeepsTheContract(t *testing.T) {
	failovertest.RunEventBatchContract(t, func(*testing.T) (func() failovertest.EventBatch, func(*testing.T) []failovertest.Event) {
		b := failovertest.NewBus()
		return func() failovertest.EventBatch { return b.NewBatch() },
			func(*testing.T) []failovertest.Event { return b.Delivered() }
	})
}

func TestAFakeRecordsItsCallsAndFailsThoseItIsToldTo(t *testing.T) {
	moves := failovertest.NewMoves()
	down := fault.Unavailable("redis down")
	moves.FailOn("PutMany", down)
	if err := moves.PutMany(t.Context(), nil); !errors.Is(err, down) {
		t.Fatalf("PutMany: %v, want the injected failure", err)
	}
	moves.FailOn("PutMany", nil)
	if err := moves.PutMany(t.Context(), nil); err != nil {
		t.Fatalf("PutMany after healing: %v", err)
	}
	if _, err := moves.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := moves.Calls.Calls(); len(got) != 3 || got[0] != "PutMany" || got[2] != "List" {
		t.Fatalf("calls %v", got)
	}
}

func TestTheFakeCapacityKeepsTheContract(t *testing.T) {
	failovertest.RunReleasesContract(t, func(*testing.T) failovertest.ReleasesUnderTest {
		c := failovertest.NewCapacity()
		return failovertest.ReleasesUnderTest{Releases: c,
			Place: func(_ *testing.T, rental, node string) { c.Place(rental, node) },
			Held:  func(_ *testing.T, node string) []string { return c.Held(node) }}
	})
}
