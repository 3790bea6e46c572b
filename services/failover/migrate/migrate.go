// Package migrate holds failover's decisions about rentals: which rentals a
// failure moves (all of a lost node's, or only those on one failed GPU),
// in which order a storm of moves is handed to the scheduler (reserved,
// then on-demand, then spot; higher priority first), how fast (a token
// bucket, so a rack loss does not flood the scheduler), and the downtime a
// move cost; and what a failure's moves are (PlanMoves: attempt
// reconciliation) and what the sweep recovers (Stale, Orphans). It imports
// neither NATS nor Redis and takes the time as a value.
package migrate

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// Class is a rental's class (rent.Class): a higher class moves first in a
// storm, a rental failover never saw scheduled (ClassUnknown) last.
type Class = rent.Class

// Classes, as the storm order names them.
const (
	ClassReserved = rent.ClassReserved
	ClassOnDemand = rent.ClassOnDemand
	ClassSpot     = rent.ClassSpot
	ClassUnknown  = rent.ClassUnknown
)

// Move is one rental to move off a node.
type Move struct {
	Rental string
	Tenant string
	Node   string
	// GPUs are the indexes of the node's GPUs the rental holds.
	GPUs     []int
	Class    Class
	Priority int
	// Since is when the failure behind the move was decided; older moves go
	// first within a class and priority.
	Since time.Time
	// Seq breaks the last ties in arrival order; set by Queue.Push.
	Seq uint64
	// Value is the caller's data, carried along.
	Value any
}

// Less is the storm order: class (higher first: reserved, on-demand,
// spot, unknown), then priority (higher first), then the older failure,
// then arrival.
func Less(a, b *Move) bool {
	if a.Class != b.Class {
		return a.Class > b.Class
	}
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if !a.Since.Equal(b.Since) {
		return a.Since.Before(b.Since)
	}
	if a.Seq != b.Seq {
		return a.Seq < b.Seq
	}
	return strings.Compare(a.Rental, b.Rental) < 0
}

// OnGPU returns the allocations that hold GPU gpu: a single failed GPU
// moves only those.
func OnGPU(allocs []Allocation, gpu int) []Allocation {
	var out []Allocation
	for _, a := range allocs {
		for _, g := range a.GPUs {
			if g == gpu {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

// Pace limits how many moves per second reach the scheduler.
type Pace struct {
	// PerSecond is the steady rate; Burst how many may go at once.
	PerSecond float64
	Burst     int
}

// Validate reports every problem.
func (p Pace) Validate() error {
	var errs []error
	if !(p.PerSecond > 0) || math.IsInf(p.PerSecond, 1) { // !(x > 0) also refuses NaN
		errs = append(errs, fmt.Errorf("per_second: %g, want a finite number > 0", p.PerSecond))
	}
	if p.Burst < 1 {
		errs = append(errs, fmt.Errorf("burst: %d, want >= 1", p.Burst))
	}
	return errors.Join(errs...)
}

// Queue holds pending moves in storm order and releases them at the pace
// (a token bucket, full at first). Not safe for concurrent use.
type Queue struct {
	bucket *rate.Limiter
	items  moveHeap
	queued map[string]bool
	seq    uint64
	// last is the latest time the bucket was asked at: an earlier now is
	// taken as last, so a clock step back neither refills nor drains it.
	last time.Time
}

// NewQueue returns an empty queue with a full bucket.
func NewQueue(p Pace) (*Queue, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("migrate: pace: %w", err)
	}
	return &Queue{bucket: rate.NewLimiter(rate.Limit(p.PerSecond), p.Burst), queued: map[string]bool{}}, nil
}

// Push adds moves; a rental already queued is not added twice. It returns
// how many were added.
func (q *Queue) Push(moves ...Move) int {
	n := 0
	for _, m := range moves {
		if q.queued[m.Rental] {
			continue
		}
		q.seq++
		m.Seq = q.seq
		q.queued[m.Rental] = true
		heap.Push(&q.items, m)
		n++
	}
	return n
}

// Pop returns the moves that may go at now, in storm order.
func (q *Queue) Pop(now time.Time) []Move {
	if now.Before(q.last) {
		now = q.last
	}
	q.last = now
	var out []Move
	for q.items.Len() > 0 && q.bucket.AllowN(now, 1) {
		m := heap.Pop(&q.items).(Move)
		delete(q.queued, m.Rental)
		out = append(out, m)
	}
	return out
}

type moveHeap []Move

func (h moveHeap) Len() int           { return len(h) }
func (h moveHeap) Less(i, j int) bool { return Less(&h[i], &h[j]) }
func (h moveHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *moveHeap) Push(x any)        { *h = append(*h, x.(Move)) }
func (h *moveHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	*h = old[:len(old)-1]
	return m
}

// Downtime is how long a moved rental did not run: from its last sign of
// life on the old node to its start on the new one. A replacement that
// started while the old run was still alive (make-before-break; lastAlive
// zero) cost nothing, and so does a start reported before the last sign of
// life (clock skew between nodes).
func Downtime(lastAlive, startedAt time.Time) time.Duration {
	if lastAlive.IsZero() || !startedAt.After(lastAlive) {
		return 0
	}
	return startedAt.Sub(lastAlive)
}
