package faults

import (
	"fmt"
	"slices"
	"sort"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// The invariant checker. judge turns what a scenario observed (the
// RENTALS and BILLING streams, the capacity store, the workloads alive on
// this machine) into figures; it is a pure function of plain values, so
// its judgement is tested with hand-made observations
// (invariants_judge_test.go).

// runSegment is one placement (attempt) of a rental that started on a node,
// from its RentalStarted to its RentalStopped (Stopped zero while it runs).
type runSegment struct {
	Rental  string
	Attempt int32
	Node    string
	Started time.Time
	Stopped time.Time
	Exit    shizuv1.ExitReason
}

// usageRecord is one UsageRecorded.
type usageRecord struct {
	ID, Rental, Node string
	Start, End       time.Time
	Seconds          int64
}

// preemption is one RentalPreempted (one per event id, as the stream keeps
// them).
type preemption struct {
	Victim, Preemptor string
	At, Deadline      time.Time
}

// gpuState is one GPU of the capacity store.
type gpuState struct {
	Node       string
	Index      int
	FreeMilli  int64
	Sharers    int
	MaxSharers int
}

// allocation is one allocation of the capacity store.
type allocation struct {
	Rental, Node string
	GPUs         []capacity.GPUShare
	HandingOver  bool
}

// history is what the RENTALS and BILLING streams hold.
type history struct {
	// Acked are the requests whose RentalRequested the stream acknowledged
	// to the load driver.
	Acked map[string]bool
	// Requested are the rentals with a RentalRequested in the stream
	// (acked or not: a publish that timed out may have been stored).
	Requested map[string]bool
	// Scheduled is rental -> attempt -> node of each RentalScheduled, and
	// PlacedAt the occurred_at of its first one (metering bills no run
	// from before it: see runWindow).
	Scheduled map[string]map[int32]string
	PlacedAt  map[string]time.Time
	// Rejected counts each rental's RentalRejected events.
	Rejected map[string]int
	// Pending are the rentals the scheduler reported waiting for capacity
	// (a RentalPending).
	Pending map[string]bool
	// Migrating counts each rental's RentalMigrating events.
	Migrating map[string]int
	// Cancelled are the rentals whose tenant asked for their cancel (a
	// RentalCancelRequested in the stream, or acked to the driver).
	Cancelled map[string]bool
	Runs      []runSegment
	Preempted []preemption
	Usage     []usageRecord
}

func newHistory() history {
	return history{Acked: map[string]bool{}, Requested: map[string]bool{}, Scheduled: map[string]map[int32]string{}, PlacedAt: map[string]time.Time{},
		Rejected: map[string]int{}, Pending: map[string]bool{}, Migrating: map[string]int{}, Cancelled: map[string]bool{}}
}

// observation is everything judge looks at.
type observation struct {
	history
	Allocations []allocation
	GPUs        []gpuState
	// Workloads counts the workload processes alive per rental.
	Workloads map[string]int
	// FaultedNodes are nodes the scenario broke on purpose: rentals
	// stopped or moved there are not evictions of healthy rentals.
	FaultedNodes map[string]bool
	// Preemption says the scenario preempts spot rentals on purpose.
	Preemption bool
	// Billing says every run has stopped and metering caught up, so
	// billed seconds are compared with run seconds.
	Billing bool
}

// figures are the checker's findings.
type figures struct {
	Acked, Lost, DoubleOutcomes, Unstarted int
	// Waiting are acked requests reported pending, with no outcome yet;
	// Orphaned those still waiting once every rental was cancelled (so
	// capacity was free for them): set by the run's end.
	Waiting, Orphaned         int
	OverCommitted, Miscounted int
	Leaked, WithoutAllocation int
	RunningTwice, Evicted     int
	RunSeconds, BilledSeconds int64
	Unbilled, DoubleBilled    int64
	Preempted, PreemptedTwice int
	PreemptorsUnplaced        int
	// PreemptionLate is the largest delay of a victim's stop past its
	// notice deadline (negative: every stop came before its deadline).
	PreemptionLate time.Duration
	// PreemptedEarly counts victims stopped before their notice deadline
	// (the notice promised them that long to checkpoint) that their
	// tenant did not cancel.
	PreemptedEarly int
	// Settle is how long the platform took to satisfy the invariants after
	// the fault ended (set by the caller).
	Settle time.Duration
	// Problems describes the first violations found, for the log.
	Problems []string
}

// maxProblems bounds figures.Problems.
const maxProblems = 20

func (f *figures) problem(format string, args ...any) {
	if len(f.Problems) < maxProblems {
		f.Problems = append(f.Problems, fmt.Sprintf(format, args...))
	}
}

// settled reports whether the invariants that must hold after settling
// hold: every acked request has exactly one outcome and has started if
// placed, no GPU is over-committed or miscounted, every allocation
// belongs to a live rental and every live rental has its allocation, and
// none runs twice.
func (f figures) settled() bool {
	return f.Lost == 0 && f.DoubleOutcomes == 0 && f.Unstarted == 0 && f.OverCommitted == 0 && f.Miscounted == 0 &&
		f.Leaked == 0 && f.WithoutAllocation == 0 && f.RunningTwice == 0
}

// billed reports whether billing matches the runs to the second.
func (f figures) billed() bool { return f.Unbilled == 0 && f.DoubleBilled == 0 }

// judge computes the figures of o.
func judge(o observation) figures {
	var f figures
	f.Acked = len(o.Acked)
	judgeOutcomes(o, &f)
	judgeCapacity(o, &f)
	judgeRuns(o, &f)
	judgePreemption(o, &f)
	if o.Billing {
		judgeBilling(o, &f)
	}
	return f
}

// latestAttempt is a rental's highest scheduled attempt (0 when none).
func latestAttempt(o observation, rental string) int32 {
	var a int32
	for n := range o.Scheduled[rental] {
		a = max(a, n)
	}
	return a
}

// segmentOf returns a rental's run of attempt, if it started.
func segmentOf(o observation, rental string, attempt int32) (runSegment, bool) {
	for _, r := range o.Runs {
		if r.Rental == rental && r.Attempt == attempt {
			return r, true
		}
	}
	return runSegment{}, false
}

// live reports whether a rental holds capacity by the streams: its latest
// placement has not stopped and it was not rejected.
func live(o observation, rental string) bool {
	a := latestAttempt(o, rental)
	if a == 0 || o.Rejected[rental] > 0 {
		return false
	}
	r, started := segmentOf(o, rental, a)
	return !started || r.Stopped.IsZero()
}

func judgeOutcomes(o observation, f *figures) {
	for _, rental := range sortedKeys(o.Acked) {
		scheduled, rejected := len(o.Scheduled[rental]) > 0, o.Rejected[rental]
		switch {
		case !scheduled && rejected == 0 && o.Pending[rental]:
			f.Waiting++
		case !scheduled && rejected == 0:
			f.Lost++
			f.problem("%s: acked, no outcome", rental)
		case scheduled && rejected > 0, rejected > 1:
			f.DoubleOutcomes++
			f.problem("%s: %d placements and %d rejections", rental, len(o.Scheduled[rental]), rejected)
		}
	}
	for _, rental := range sortedKeys(o.Scheduled) {
		if !live(o, rental) {
			continue
		}
		if _, started := segmentOf(o, rental, latestAttempt(o, rental)); !started {
			f.Unstarted++
			f.problem("%s: attempt %d placed, never started", rental, latestAttempt(o, rental))
		}
	}
}

func judgeCapacity(o observation, f *figures) {
	type gpuKey struct {
		node  string
		index int
	}
	used := map[gpuKey]int64{}
	sharers := map[gpuKey]int{}
	byRental := map[string]int{}
	for _, a := range o.Allocations {
		for _, g := range a.GPUs {
			used[gpuKey{a.Node, g.Index}] += g.Milli
			sharers[gpuKey{a.Node, g.Index}]++
		}
		if a.HandingOver {
			continue // a move's old run, freed by ReleaseOn
		}
		if a1 := latestAttempt(o, a.Rental); live(o, a.Rental) && o.Scheduled[a.Rental][a1] == a.Node {
			byRental[a.Rental]++
		} else {
			f.Leaked++
			f.problem("%s: allocation on %s, but the rental is not live there", a.Rental, a.Node)
		}
	}
	for _, g := range o.GPUs {
		k := gpuKey{g.Node, g.Index}
		if used[k] > capacity.MilliPerGPU || g.FreeMilli < 0 || (g.MaxSharers > 0 && sharers[k] > g.MaxSharers) {
			f.OverCommitted++
			f.problem("%s GPU %d: %d milli allocated to %d sharers (max %d), %d free", g.Node, g.Index, used[k], sharers[k], g.MaxSharers, g.FreeMilli)
		} else if g.FreeMilli != capacity.MilliPerGPU-used[k] {
			f.Miscounted++
			f.problem("%s GPU %d: %d milli free, its allocations hold %d", g.Node, g.Index, g.FreeMilli, used[k])
		}
	}
	for _, rental := range sortedKeys(o.Scheduled) {
		if live(o, rental) && byRental[rental] == 0 {
			f.WithoutAllocation++
			f.problem("%s: live (attempt %d), no allocation", rental, latestAttempt(o, rental))
		}
	}
}

func judgeRuns(o observation, f *figures) {
	open := map[string]int{}
	evicted := map[string]bool{}
	victims := map[string]bool{}
	for _, p := range o.Preempted {
		victims[p.Victim] = true
	}
	for _, r := range o.Runs {
		if r.Stopped.IsZero() {
			open[r.Rental]++
			continue
		}
		switch r.Exit {
		case shizuv1.ExitReason_EXIT_REASON_COMPLETED:
		case shizuv1.ExitReason_EXIT_REASON_CANCELLED:
			// An agent also reports a workload it stops because its
			// allocation is gone (a lost store) as cancelled.
			if !o.Cancelled[r.Rental] {
				evicted[r.Rental] = true
			}
		case shizuv1.ExitReason_EXIT_REASON_PREEMPTED:
			if !o.Preemption || !victims[r.Rental] {
				evicted[r.Rental] = true
			}
		default:
			if !o.FaultedNodes[r.Node] {
				evicted[r.Rental] = true
			}
		}
	}
	for rental, n := range o.Migrating {
		if n == 0 {
			continue
		}
		for _, node := range o.Scheduled[rental] {
			if !o.FaultedNodes[node] {
				evicted[rental] = true
			}
		}
	}
	for _, rental := range sortedKeys(evicted) {
		f.Evicted++
		f.problem("%s: a healthy rental was stopped or moved", rental)
	}
	for _, rental := range sortedKeys(open) {
		if n := max(open[rental], o.Workloads[rental]); n > 1 {
			f.RunningTwice++
			f.problem("%s: %d runs open, %d workloads alive", rental, open[rental], o.Workloads[rental])
		}
	}
	for _, rental := range sortedKeys(o.Workloads) {
		if open[rental] == 0 && o.Workloads[rental] > 0 {
			f.RunningTwice++
			f.problem("%s: %d workloads alive, no run open", rental, o.Workloads[rental])
		}
	}
}

func judgePreemption(o observation, f *figures) {
	per := map[string]int{}
	f.PreemptionLate = -time.Hour
	for _, p := range o.Preempted {
		per[p.Victim]++
		if per[p.Victim] == 2 {
			f.PreemptedTwice++
			f.problem("%s preempted more than once", p.Victim)
		}
		if per[p.Victim] > 1 {
			continue
		}
		f.Preempted++
		if r, ok := segmentOf(o, p.Victim, latestAttempt(o, p.Victim)); ok && !r.Stopped.IsZero() {
			f.PreemptionLate = max(f.PreemptionLate, r.Stopped.Sub(p.Deadline))
			if r.Stopped.Before(p.Deadline) && !o.Cancelled[p.Victim] {
				f.PreemptedEarly++
				f.problem("%s stopped at %s, %s before its notice deadline (exit %s)", p.Victim, r.Stopped.Format(time.StampMilli), p.Deadline.Sub(r.Stopped), r.Exit)
			}
		} else {
			f.problem("%s preempted at %s, not stopped", p.Victim, p.At.Format(time.StampMilli))
		}
		if len(o.Scheduled[p.Preemptor]) == 0 {
			f.PreemptorsUnplaced++
			f.problem("%s preempted %s and was not placed", p.Preemptor, p.Victim)
		}
	}
	if f.Preempted == 0 {
		f.PreemptionLate = 0
	}
}

// runSeconds is what a run bills by metering's rule: every second that
// starts before its end (per-second billing rounded up), with no minimum
// charge (the harness runs metering with -minimum-charge 0s).
func runSeconds(r runSegment) int64 {
	return int64((r.Stopped.Sub(r.Started) + time.Second - 1) / time.Second)
}

// runWindow is the run as metering bills it: a run stamped as started
// before its placement (a node clock behind the scheduler's) is billed
// from the placement, for as long as its stamps say (ledger's Skew).
func runWindow(o observation, r runSegment) (start, stop time.Time) {
	start, stop = r.Started, r.Stopped
	if placed, ok := o.PlacedAt[placementKey(r.Rental, r.Attempt)]; ok && start.Before(placed) {
		skew := placed.Sub(start)
		start = placed
		if !stop.IsZero() {
			stop = stop.Add(skew)
		}
	}
	return start, stop
}

func placementKey(rental string, attempt int32) string { return fmt.Sprintf("%s/%d", rental, attempt) }

func judgeBilling(o observation, f *figures) {
	billed := make([]int64, len(o.Runs))
	for _, u := range o.Usage {
		f.BilledSeconds += u.Seconds
		i := slices.IndexFunc(o.Runs, func(r runSegment) bool {
			start, stop := runWindow(o, r)
			return r.Rental == u.Rental && r.Node == u.Node && !u.Start.Before(start) && (stop.IsZero() || u.Start.Before(stop))
		})
		if i < 0 {
			f.DoubleBilled += u.Seconds
			f.problem("%s: record %s bills %d s outside every run", u.Rental, u.ID, u.Seconds)
			continue
		}
		billed[i] += u.Seconds
	}
	for i, r := range o.Runs {
		if r.Stopped.IsZero() {
			continue
		}
		want := runSeconds(r)
		f.RunSeconds += want
		switch got := billed[i]; {
		case got < want:
			f.Unbilled += want - got
			f.problem("%s attempt %d on %s: ran %d s, billed %d s", r.Rental, r.Attempt, r.Node, want, got)
		case got > want:
			f.DoubleBilled += got - want
			f.problem("%s attempt %d on %s: ran %d s, billed %d s", r.Rental, r.Attempt, r.Node, want, got)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
