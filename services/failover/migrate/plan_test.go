package migrate

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Fixture builders: valid defaults, changed by the caller.

func lostOrder() Order {
	return Order{Node: "n1", Epoch: 4, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST), Mode: ModeBreak,
		LastAlive: t0.Add(-3 * time.Second), LastBeat: t0.Add(-3 * time.Second), Decided: t0, Cause: "node:n1:lost:4"}
}

func noticeOrder() Order {
	return Order{Node: "n1", Epoch: 4, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION),
		Mode: ModeMakeBeforeBreak, Decided: t0.Add(-time.Minute), Cause: "node:n1:interruption:4"}
}

func alloc(rental string, gpus ...int) Allocation {
	return Allocation{Rental: rental, Tenant: "acme", GPUs: gpus}
}

func placed(attempt int32, plan shizuv1.Plan, priority int32) Placement {
	return Placement{Attempt: attempt, Tenant: "acme", Node: "n1", Spec: &shizuv1.RentalSpec{Plan: plan, Priority: priority}}
}

// recorded is the move a make-before-break notice recorded for rental off
// n1 (attempt 1 -> 2).
func recorded(rental string) Record {
	o := noticeOrder()
	return Record{Rental: rental, Tenant: "acme", FromNode: "n1", FromEpoch: 4, FromAttempt: 1, NextAttempt: 2,
		Reason: o.Reason, Mode: o.Mode, DecidedAt: o.Decided, Cause: o.Cause, Class: ClassSpot}
}

func plannedRentals(rs []Record) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Rental
	}
	return out
}

func TestPlanMoves(t *testing.T) {
	t.Parallel()
	handed := alloc("r1", 0)
	handed.HandingOver = true
	cases := []struct {
		name       string
		allocs     []Allocation
		placements map[string]Placement
		prevs      map[string]Record
		order      Order
		check      func(t *testing.T, p Plan)
	}{
		{
			name:       "a lost node's rental moves at its next attempt, ranked by its placement",
			allocs:     []Allocation{alloc("r1", 2, 3)},
			placements: map[string]Placement{"r1": placed(1, shizuv1.Plan_PLAN_RESERVED, 7)},
			order:      lostOrder(),
			check: func(t *testing.T, p Plan) {
				m := p.Moves[0]
				if len(p.Moves) != 1 || m.FromAttempt != 1 || m.NextAttempt != 2 || m.Class != ClassReserved || m.Priority != 7 {
					t.Fatalf("planned %+v", p.Moves)
				}
				if m.FromNode != "n1" || m.FromEpoch != 4 || !slices.Equal(m.GPUs, []int{2, 3}) || m.Mode != ModeBreak ||
					!m.DecidedAt.Equal(t0) || !m.LastAlive.Equal(t0.Add(-3*time.Second)) || m.Cause != "node:n1:lost:4" {
					t.Fatalf("the move does not carry its order: %+v", m)
				}
			},
		},
		{
			name:   "a rental failover never saw scheduled moves last and without attempts (an attempt-less report)",
			allocs: []Allocation{alloc("r1", 0)},
			order:  lostOrder(),
			check: func(t *testing.T, p Plan) {
				if m := p.Moves[0]; m.FromAttempt != 0 || m.NextAttempt != 0 || m.Class != ClassUnknown {
					t.Fatalf("planned %+v, want attempt 0 of class unknown", m)
				}
			},
		},
		{
			name:       "a rental moved here before its RentalScheduled was read moves as that newer attempt (no lost attempt)",
			allocs:     []Allocation{alloc("r1", 0)},
			placements: map[string]Placement{"r1": placed(1, shizuv1.Plan_PLAN_ON_DEMAND, 0)},
			prevs:      map[string]Record{"r1": func() Record { r := recorded("r1"); r.FromNode = "n0"; return r }()},
			order:      lostOrder(),
			check: func(t *testing.T, p Plan) {
				if m := p.Moves[0]; m.FromAttempt != 2 || m.NextAttempt != 3 || !m.DecidedAt.Equal(t0) {
					t.Fatalf("planned %+v, want attempt 2 -> 3 decided now", m)
				}
			},
		},
		{
			name:       "a rental moved off another node at an older attempt is no newer attempt here",
			allocs:     []Allocation{alloc("r1", 0)},
			placements: map[string]Placement{"r1": placed(3, shizuv1.Plan_PLAN_ON_DEMAND, 0)},
			prevs:      map[string]Record{"r1": func() Record { r := recorded("r1"); r.FromNode = "n0"; return r }()},
			order:      lostOrder(),
			check: func(t *testing.T, p Plan) {
				if m := p.Moves[0]; m.FromAttempt != 3 || m.NextAttempt != 4 {
					t.Fatalf("planned %+v, want attempt 3 -> 4 from the placement", m)
				}
			},
		},
		{
			name:       "a move recorded already (a spot notice's) keeps when it was decided and breaks now",
			allocs:     []Allocation{alloc("r1", 0)},
			placements: map[string]Placement{"r1": placed(1, shizuv1.Plan_PLAN_SPOT, 0)},
			prevs:      map[string]Record{"r1": recorded("r1")},
			order:      lostOrder(),
			check: func(t *testing.T, p Plan) {
				if m := p.Moves[0]; m.Mode != ModeBreak || !m.DecidedAt.Equal(noticeOrder().Decided) || m.NextAttempt != 2 {
					t.Fatalf("planned %+v, want a break decided at the notice", m)
				}
			},
		},
		{
			name:       "a redelivered notice plans nothing for a move under way",
			allocs:     []Allocation{alloc("r1", 0)},
			placements: map[string]Placement{"r1": placed(1, shizuv1.Plan_PLAN_SPOT, 0)},
			prevs:      map[string]Record{"r1": recorded("r1")},
			order:      noticeOrder(),
			check: func(t *testing.T, p Plan) {
				if len(p.Moves)+len(p.Revised)+len(p.Release) != 0 {
					t.Fatalf("planned %+v", p)
				}
			},
		},
		{
			name:       "an allocation handed over already is released on a lost node, not moved, and dates the downtime",
			allocs:     []Allocation{handed},
			placements: map[string]Placement{"r1": placed(2, shizuv1.Plan_PLAN_SPOT, 0)},
			prevs:      map[string]Record{"r1": recorded("r1")},
			order:      lostOrder(),
			check: func(t *testing.T, p Plan) {
				if len(p.Moves) != 0 || !slices.Equal(p.Release, []string{"r1"}) || len(p.Revised) != 1 {
					t.Fatalf("planned %+v, want r1 released and its move revised", p)
				}
				if r := p.Revised[0]; !r.LastAlive.Equal(lostOrder().LastAlive) || !r.LastBeat.Equal(lostOrder().LastBeat) ||
					r.NextAttempt != 2 || r.Mode != ModeMakeBeforeBreak {
					t.Fatalf("revised %+v, want the old run's last sign of life on the notice's move", r)
				}
			},
		},
		{
			name:   "a handed-over allocation whose move knows its downtime start already is only released",
			allocs: []Allocation{handed},
			prevs: map[string]Record{"r1": func() Record {
				r := recorded("r1")
				r.LastAlive = t0.Add(-time.Hour)
				return r
			}()},
			order: lostOrder(),
			check: func(t *testing.T, p Plan) {
				if len(p.Moves) != 0 || len(p.Revised) != 0 || !slices.Equal(p.Release, []string{"r1"}) {
					t.Fatalf("planned %+v", p)
				}
			},
		},
		{
			name:   "a handed-over allocation in a redelivered notice is neither moved nor released",
			allocs: []Allocation{handed},
			prevs:  map[string]Record{"r1": recorded("r1")},
			order:  noticeOrder(),
			check: func(t *testing.T, p Plan) {
				if len(p.Moves)+len(p.Revised)+len(p.Release) != 0 {
					t.Fatalf("planned %+v", p)
				}
			},
		},
		{
			name:   "every allocation of a failure is planned, in the order given",
			allocs: []Allocation{alloc("c", 2), alloc("a", 0), alloc("b", 1)},
			order:  lostOrder(),
			check: func(t *testing.T, p Plan) {
				if got := plannedRentals(p.Moves); !slices.Equal(got, []string{"c", "a", "b"}) {
					t.Fatalf("planned %v", got)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t, PlanMoves(c.allocs, c.placements, c.prevs, c.order))
		})
	}
}

func TestTheSweepRequeuesOnlyMovesLeftUnpublishedASweepAgo(t *testing.T) {
	t.Parallel()
	const age = 10 * time.Second
	old := func(rental string, change func(*Record)) Record {
		r := recorded(rental)
		r.DecidedAt = t0.Add(-time.Minute)
		change(&r)
		return r
	}
	recs := map[string]Record{
		"left":      old("left", func(*Record) {}),
		"published": old("published", func(r *Record) { r.Published = true }),
		"failed":    old("failed", func(r *Record) { r.Failed = "tenant is no subject token" }),
		"young":     old("young", func(r *Record) { r.DecidedAt = t0.Add(-age + time.Millisecond) }),
		"due":       old("due", func(r *Record) { r.DecidedAt = t0.Add(-age) }),
	}
	ids := []string{"young", "due", "failed", "gone", "published", "left"}
	var got []string
	for _, m := range Stale(ids, recs, t0, age) {
		got = append(got, m.Rental)
		if m.Value.(Record).Rental != m.Rental {
			t.Fatalf("the move does not carry its record: %+v", m)
		}
	}
	if want := []string{"due", "left"}; !slices.Equal(got, want) {
		t.Fatalf("requeued %v, want %v", got, want)
	}
}

func TestOrphansAreTheDeadNodesAllocationsNoRecordedMoveCovers(t *testing.T) {
	t.Parallel()
	movedHere := recorded("moved-here")
	movedHere.FromNode = "n0" // moved onto n1, then n1 died
	moving := map[string]Record{"covered": recorded("covered"), "moved-here": movedHere}
	allocs := []Allocation{alloc("covered", 0), alloc("unrecorded", 1), alloc("moved-here", 2)}
	var got []string
	for _, a := range Orphans("n1", allocs, moving) {
		got = append(got, a.Rental)
	}
	if want := []string{"unrecorded", "moved-here"}; !slices.Equal(got, want) {
		t.Fatalf("orphans %v, want %v", got, want)
	}
	if got := Orphans("n1", nil, moving); len(got) != 0 {
		t.Fatalf("orphans of an empty node: %v", got)
	}
}

func TestARecordIsQueuedInItsStormRank(t *testing.T) {
	t.Parallel()
	r := recorded("r1")
	r.Priority, r.GPUs = 9, []int{4}
	m := r.Move()
	if m.Rental != "r1" || m.Class != ClassSpot || m.Priority != 9 || !m.Since.Equal(r.DecidedAt) || m.Node != "n1" ||
		!slices.Equal(m.GPUs, []int{4}) || fmt.Sprint(m.Value) != fmt.Sprint(r) {
		t.Fatalf("move %+v of %+v", m, r)
	}
}

// Records outlive replicas: the class is stored as the storm rank replicas
// wrote before classes became rent.Class (0 reserved ... 3 unknown).
func TestARecordStoresItsClassAsTheStormRankOlderReplicasWrote(t *testing.T) {
	t.Parallel()
	cases := []struct {
		class Class
		json  string
	}{
		{ClassReserved, `"class":0`},
		{ClassOnDemand, `"class":1`},
		{ClassSpot, `"class":2`},
		{ClassUnknown, `"class":3`},
	}
	for _, tc := range cases {
		t.Run(tc.class.String(), func(t *testing.T) {
			r := recorded("r1")
			r.Class = tc.class
			raw, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(raw), tc.json) || strings.Count(string(raw), `"class"`) != 1 {
				t.Fatalf("%s recorded as %s, want one %s", tc.class, raw, tc.json)
			}
			var back Record
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(back) != fmt.Sprint(r) {
				t.Fatalf("read back %+v, want %+v", back, r)
			}
		})
	}
	var r Record
	if err := json.Unmarshal([]byte(`{"rental":"r1","class":9}`), &r); err != nil || r.Class != ClassUnknown || r.Rental != "r1" {
		t.Fatalf("a rank no replica writes: %+v (%v), want class unknown", r, err)
	}
}
