package records

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// The outcome claim names the allocation it announces, so a replica that
// reserved a rental and lost the claim to another replica announcing that
// same reservation keeps it, while a stale outcome (an earlier allocation
// of the rental, since released) or another outcome makes it give the
// reservation back.
func TestAReservationAnnouncedByAnotherReplicaIsKept(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	rec := New(rdb, "t", time.Hour)
	created := time.Unix(1_700_000_000, 123_456_789)
	fresh := capacity.Allocation{Placement: capacity.Placement{RentalID: "r1", NodeID: "n1"}, CreatedAt: created}
	existing := fresh
	existing.Existing = true // what the other replica's reserve returned
	earlier := capacity.Allocation{Placement: capacity.Placement{RentalID: "r1", NodeID: "n1"}, CreatedAt: created.Add(-time.Hour)}

	// Replica B, given a duplicate delivery, got A's reservation back and
	// records first; then A claims.
	b, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeScheduled, []string{ports.AllocToken(existing)}, nil)
	if err != nil || !b[0].Won || !round.KeepReservation(b[0], ports.AllocToken(existing), existing.Existing) {
		t.Fatalf("first claim = %+v, %v", b, err)
	}
	a, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeScheduled, []string{ports.AllocToken(fresh)}, nil)
	if err != nil || a[0].Won || a[0].Outcome != round.OutcomeScheduled {
		t.Fatalf("second claim = %+v, %v", a, err)
	}
	if !round.KeepReservation(a[0], ports.AllocToken(fresh), fresh.Existing) {
		t.Fatal("the replica that reserved gives back the allocation the other replica announced")
	}
	// A fresh reservation of a rental whose announced allocation was an
	// earlier one (it ran and stopped, the request came again) is given back.
	if _, err := rec.Claim(t.Context(), []string{"r2"}, round.OutcomeScheduled, []string{ports.AllocToken(earlier)}, nil); err != nil {
		t.Fatal(err)
	}
	again, err := rec.Claim(t.Context(), []string{"r2"}, round.OutcomeScheduled, []string{ports.AllocToken(fresh)}, nil)
	if err != nil || round.KeepReservation(again[0], ports.AllocToken(fresh), fresh.Existing) {
		t.Fatalf("a reservation after the announced one was released is kept: %+v, %v", again, err)
	}
	// Another outcome recorded first: given back, even if Existing.
	if _, err := rec.Claim(t.Context(), []string{"r3"}, round.OutcomeCancelled, nil, nil); err != nil {
		t.Fatal(err)
	}
	c, err := rec.Claim(t.Context(), []string{"r3"}, round.OutcomeScheduled, []string{ports.AllocToken(existing)}, nil)
	if err != nil || round.KeepReservation(c[0], ports.AllocToken(existing), existing.Existing) {
		t.Fatalf("a reservation of a cancelled rental is kept: %+v, %v", c, err)
	}
	// The outcome reads back without the token.
	if got, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeRejected, nil, nil); err != nil || got[0].Outcome != round.OutcomeScheduled {
		t.Fatalf("outcome = %+v, %v", got, err)
	}
}

// A redelivery that got back, as Existing, an allocation reserved after
// the announced one was released (another replica reserved it fresh and
// gives it back) does not keep it: the token, not Existing, decides.
func TestAnExistingAllocationOtherThanTheAnnouncedOneIsGivenBack(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	rec := New(rdb, "t", time.Hour)
	created := time.Unix(1_700_000_000, 0)
	announced := capacity.Allocation{Placement: capacity.Placement{RentalID: "r1", NodeID: "n1"}, CreatedAt: created}
	later := capacity.Allocation{Placement: capacity.Placement{RentalID: "r1", NodeID: "n2"}, CreatedAt: created.Add(time.Hour), Existing: true}
	if _, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeScheduled, []string{ports.AllocToken(announced)}, nil); err != nil {
		t.Fatal(err)
	}
	c, err := rec.Claim(t.Context(), []string{"r1"}, round.OutcomeScheduled, []string{ports.AllocToken(later)}, nil)
	if err != nil || round.KeepReservation(c[0], ports.AllocToken(later), later.Existing) {
		t.Fatalf("an Existing allocation other than the announced one is kept: %+v, %v", c, err)
	}
	// An outcome recorded before outcomes named their allocation: Existing decides.
	if err := rdb.Set(t.Context(), rec.outcomeKey("r2"), round.OutcomeScheduled, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	old, err := rec.Claim(t.Context(), []string{"r2"}, round.OutcomeScheduled, []string{ports.AllocToken(later)}, nil)
	if err != nil || !round.KeepReservation(old[0], ports.AllocToken(later), later.Existing) {
		t.Fatalf("a redelivery under an untokened outcome lost its Existing allocation: %+v, %v", old, err)
	}
}
