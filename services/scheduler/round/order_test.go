package round_test

import (
	"slices"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

// moved is a re-placement: failover moved the rental off its node after
// its first placement.
func moved(j *round.Job) { j.Attempt = 2 }

func TestAMovedRentalGoesAheadOfEveryNewRequestOfItsClass(t *testing.T) {
	t.Parallel()
	// The new requests were made before the move (published while NATS was
	// down, say), one of them with a high priority, and the moved rentals
	// share one tenant: none of that puts a new request first.
	lost := t0.Add(20 * time.Second)
	jobs := []*round.Job{
		job(t, "new-old", madeAt(t0)),
		job(t, "new-urgent", madeAt(t0), func(j *round.Job) { j.Request.Priority = 900 }),
		job(t, "moved-a", madeAt(lost), moved, func(j *round.Job) { j.Request.Tenant = "acme" }),
		job(t, "moved-b", madeAt(lost.Add(time.Second)), moved, func(j *round.Job) { j.Request.Tenant = "acme" }),
		job(t, "reserved-new", madeAt(lost), reserved),
		job(t, "spot-moved", madeAt(lost), spot, moved),
		job(t, "spot-new", madeAt(t0), spot),
	}
	now := lost.Add(2 * time.Second)
	round.Order(jobs, now, config(t))
	want := []string{"reserved-new", "moved-a", "moved-b", "new-urgent", "new-old", "spot-moved", "spot-new"}
	if got := ids(jobs); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v: moved rentals at the head of their class, classes in their order", got, want)
	}
}

func TestARoundPlacesTheMovedRentalOnTheLastFreeGPUBeforeANewRequest(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	jobs := []*round.Job{
		job(t, "new", madeAt(t0), func(j *round.Job) { j.Request.Priority = 500 }),
		job(t, "moved", madeAt(now), moved),
	}
	plan := round.Plan(viewOf(node("n1", 1)), jobs, now, config(t), nil)
	if got := ids(plan.Reserve); !slices.Equal(got, []string{"moved"}) {
		t.Fatalf("reserved %v, want the moved rental on the one free GPU", got)
	}
	if got := ids(pendingJobs(plan.Pending)); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("pending %v, want the new request waiting", got)
	}
}

func TestAnOlderNewRequestStillOvertakesAMovedRentalOfALowerClass(t *testing.T) {
	t.Parallel()
	// Aging crosses classes (queue.Order): being moved puts a rental at
	// the head of its own class only.
	cfg := config(t)
	now := t0.Add(time.Hour)
	jobs := []*round.Job{
		job(t, "spot-moved", madeAt(now), spot, moved),
		job(t, "on-demand-new", madeAt(now)),
	}
	round.Order(jobs, now, cfg)
	if got := ids(jobs); !slices.Equal(got, []string{"on-demand-new", "spot-moved"}) {
		t.Fatalf("order %v, want the on-demand request before the moved spot rental", got)
	}
}
