package migrate

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func rentals(ms []Move) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Rental
	}
	return out
}

func allocRentals(as []Allocation) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Rental
	}
	return out
}

func newQueue(t *testing.T, p Pace) *Queue {
	t.Helper()
	q, err := NewQueue(p)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestAStormGoesReservedThenOnDemandThenSpotHighPriorityFirst(t *testing.T) {
	t.Parallel()
	q := newQueue(t, Pace{PerSecond: 1000, Burst: 100})
	q.Push(
		Move{Rental: "spot-hi", Class: ClassSpot, Priority: 900, Since: t0},
		Move{Rental: "od-lo", Class: ClassOnDemand, Priority: 0, Since: t0},
		Move{Rental: "unknown", Class: ClassUnknown, Since: t0},
		Move{Rental: "res", Class: ClassReserved, Since: t0.Add(time.Second)},
		Move{Rental: "od-hi", Class: ClassOnDemand, Priority: 10, Since: t0.Add(time.Second)},
		Move{Rental: "od-lo-older", Class: ClassOnDemand, Priority: 0, Since: t0.Add(-time.Second)},
	)
	got := rentals(q.Pop(t0))
	want := []string{"res", "od-hi", "od-lo-older", "od-lo", "spot-hi", "unknown"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestTheQueueReleasesMovesAtItsPace(t *testing.T) {
	t.Parallel()
	q := newQueue(t, Pace{PerSecond: 10, Burst: 3})
	for i := range 10 {
		q.Push(Move{Rental: fmt.Sprintf("r%02d", i), Class: ClassOnDemand, Since: t0})
	}
	if got := len(q.Pop(t0)); got != 3 {
		t.Fatalf("burst released %d, want 3", got)
	}
	if got := len(q.Pop(t0.Add(50 * time.Millisecond))); got != 0 {
		t.Fatalf("released %d before a token refilled", got)
	}
	if got := len(q.Pop(t0.Add(250 * time.Millisecond))); got != 2 {
		t.Fatalf("released %d after 250 ms, want 2", got)
	}
	if got := len(q.Pop(t0.Add(time.Hour))); got != 3 {
		t.Fatalf("released %d after a long pause, want the burst of 3", got)
	}
	if got := len(q.Pop(t0.Add(2 * time.Hour))); got != 2 {
		t.Fatalf("left %d, want 2", got)
	}
}

func TestARentalIsQueuedOnce(t *testing.T) {
	t.Parallel()
	q := newQueue(t, Pace{PerSecond: 1, Burst: 10})
	if n := q.Push(Move{Rental: "r1"}, Move{Rental: "r1"}); n != 1 {
		t.Fatalf("added %d, want 1", n)
	}
	q.Pop(t0)
	if n := q.Push(Move{Rental: "r1"}); n != 1 {
		t.Fatal("a rental popped could not be queued again")
	}
}

func TestOnlyTheRentalsOfAFailedGPUMove(t *testing.T) {
	t.Parallel()
	allocs := []Allocation{
		{Rental: "whole-3", GPUs: []int{3}},
		{Rental: "nvlink-2-3", GPUs: []int{2, 3}},
		{Rental: "other-4", GPUs: []int{4}},
		{Rental: "frac-3", GPUs: []int{3}},
	}
	got := allocRentals(OnGPU(allocs, 3))
	if want := []string{"whole-3", "nvlink-2-3", "frac-3"}; !slices.Equal(got, want) {
		t.Fatalf("moved %v, want %v", got, want)
	}
	if got := OnGPU(allocs, 7); len(got) != 0 {
		t.Fatalf("a healthy GPU moved %v", allocRentals(got))
	}
}

func TestDowntime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		lastAlive time.Time
		started   time.Time
		want      time.Duration
	}{
		{"a restart after a crash costs the gap since the last beat", t0, t0.Add(1800 * time.Millisecond), 1800 * time.Millisecond},
		{"a make-before-break replacement costs nothing", time.Time{}, t0, 0},
		{"a start stamped before the last beat (clock skew) costs nothing", t0, t0.Add(-time.Millisecond), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := Downtime(c.lastAlive, c.started); got != c.want {
				t.Fatalf("downtime %s, want %s", got, c.want)
			}
		})
	}
}

func TestAPaceWithoutRateIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := NewQueue(Pace{}); err == nil {
		t.Fatal("accepted")
	}
	// NaN compares false with everything, so "<= 0" alone let it through;
	// an infinite rate is no pace at all.
	for _, rate := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1} {
		if err := (Pace{PerSecond: rate, Burst: 1}).Validate(); err == nil {
			t.Errorf("a pace of %g moves per second was accepted", rate)
		}
	}
	if err := (Pace{PerSecond: 0.5, Burst: 1}).Validate(); err != nil {
		t.Errorf("a finite positive pace was refused: %v", err)
	}
}

// Whatever is pushed and however the clock moves, every move comes out
// exactly once, in storm order within each pop, never faster than the pace.
func TestPropertyEveryMoveComesOutOnceInOrder(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		pace := Pace{PerSecond: float64(rapid.IntRange(1, 100).Draw(rt, "rate")), Burst: rapid.IntRange(1, 20).Draw(rt, "burst")}
		q, err := NewQueue(pace)
		if err != nil {
			rt.Fatal(err)
		}
		now := t0
		pushed := map[string]bool{}
		seen := map[string]bool{}
		released := 0
		for i := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			if rapid.Bool().Draw(rt, "push") {
				id := fmt.Sprintf("r%d", rapid.IntRange(0, 40).Draw(rt, "id"))
				if !pushed[id] || seen[id] {
					q.Push(Move{Rental: id, Class: Class(rapid.IntRange(0, 3).Draw(rt, "class")),
						Priority: rapid.IntRange(0, 3).Draw(rt, "prio"), Since: now})
					pushed[id], seen[id] = true, false
				}
			}
			now = now.Add(time.Duration(rapid.IntRange(0, 300).Draw(rt, "dt")) * time.Millisecond)
			out := q.Pop(now)
			for k := 1; k < len(out); k++ {
				if Less(&out[k], &out[k-1]) {
					rt.Fatalf("step %d: %s came out before %s", i, out[k-1].Rental, out[k].Rental)
				}
			}
			for _, m := range out {
				if seen[m.Rental] {
					rt.Fatalf("%s came out twice", m.Rental)
				}
				seen[m.Rental] = true
			}
			released += len(out)
			budget := float64(pace.Burst) + now.Sub(t0).Seconds()*pace.PerSecond
			if float64(released) > budget+1e-9 {
				rt.Fatalf("released %d by %s, pace allows %.1f", released, now.Sub(t0), budget)
			}
		}
		rest := q.Pop(now.Add(24 * time.Hour))
		rest = append(rest, q.Pop(now.Add(48*time.Hour))...)
		for { // a full bucket releases nothing only when the queue is empty
			now = now.Add(72 * time.Hour)
			out := q.Pop(now)
			if len(out) == 0 {
				break
			}
			rest = append(rest, out...)
		}
		for _, m := range rest {
			seen[m.Rental] = true
		}
		for id := range pushed {
			if !seen[id] {
				rt.Fatalf("%s never came out", id)
			}
		}
	})
}
