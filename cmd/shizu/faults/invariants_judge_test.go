package faults

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// cleanObservation is a platform in order: r1 runs a whole GPU on n1
// (billed 10 s so far), r2 completed after 5.2 s (billed 6 s), r3 was
// rejected; every metered second is billed once.
func cleanObservation() observation {
	h := newHistory()
	for _, r := range []string{"r1", "r2", "r3"} {
		h.Acked[r], h.Requested[r] = true, true
	}
	h.Scheduled["r1"] = map[int32]string{1: "n1"}
	h.Scheduled["r2"] = map[int32]string{1: "n1"}
	h.Rejected["r3"] = 1
	h.Runs = []runSegment{
		{Rental: "r1", Attempt: 1, Node: "n1", Started: t0},
		{Rental: "r2", Attempt: 1, Node: "n1", Started: t0, Stopped: t0.Add(5200 * time.Millisecond), Exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED},
	}
	h.Usage = []usageRecord{
		{ID: "u1", Rental: "r1", Node: "n1", Start: t0, End: t0.Add(10 * time.Second), Seconds: 10},
		{ID: "u2", Rental: "r2", Node: "n1", Start: t0, End: t0.Add(5200 * time.Millisecond), Seconds: 6},
	}
	return observation{history: h,
		Allocations: []allocation{{Rental: "r1", Node: "n1", GPUs: []capacity.GPUShare{{Index: 0, Milli: 1000}}}},
		GPUs: []gpuState{{Node: "n1", Index: 0, FreeMilli: 0, Sharers: 1, MaxSharers: 8},
			{Node: "n1", Index: 1, FreeMilli: 1000, MaxSharers: 8}},
		Workloads: map[string]int{"r1": 1}, FaultedNodes: map[string]bool{}, Billing: true}
}

func TestACleanObservationHasNoViolation(t *testing.T) {
	f := judge(cleanObservation())
	if !f.settled() || !f.billed() || f.Evicted != 0 || len(f.Problems) > 0 {
		t.Fatalf("figures %+v", f)
	}
	if f.Acked != 3 || f.RunSeconds != 6 || f.BilledSeconds != 16 {
		t.Fatalf("acked %d, run %d s, billed %d s; want 3, 6 (closed runs only), 16", f.Acked, f.RunSeconds, f.BilledSeconds)
	}
}

func TestTheJudgeFindsEachViolation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(*observation)
		check  func(figures) bool
	}{
		{"an acked request with no outcome is lost", func(o *observation) { o.Acked["r4"] = true },
			func(f figures) bool { return f.Lost == 1 && !f.settled() }},
		{"an acked request reported pending is waiting, not lost", func(o *observation) { o.Acked["r4"], o.Pending["r4"] = true, true },
			func(f figures) bool { return f.Lost == 0 && f.Waiting == 1 && f.settled() }},
		{"a request both placed and rejected has two outcomes", func(o *observation) { o.Rejected["r1"] = 1 },
			func(f figures) bool { return f.DoubleOutcomes == 1 }},
		{"a placement that never starts is unstarted", func(o *observation) { o.Scheduled["r1"][2] = "n1" },
			func(f figures) bool { return f.Unstarted == 1 && !f.settled() }},
		{"an allocation of a stopped rental is leaked", func(o *observation) {
			o.Allocations = append(o.Allocations, allocation{Rental: "r2", Node: "n1", GPUs: []capacity.GPUShare{{Index: 1, Milli: 500}}})
			o.GPUs[1].FreeMilli = 500
		}, func(f figures) bool { return f.Leaked == 1 && f.Miscounted == 0 && !f.settled() }},
		{"an allocation on another node than the placement is leaked", func(o *observation) { o.Allocations[0].Node = "n2" },
			func(f figures) bool { return f.Leaked == 1 && f.WithoutAllocation == 1 }},
		{"a live rental without its allocation is reported", func(o *observation) {
			o.Allocations = nil
			o.GPUs[0].FreeMilli = 1000
		}, func(f figures) bool { return f.WithoutAllocation == 1 && f.Leaked == 0 }},
		{"more than a GPU allocated is over-commitment", func(o *observation) {
			o.Allocations = append(o.Allocations, allocation{Rental: "r5", Node: "n1", GPUs: []capacity.GPUShare{{Index: 0, Milli: 250}}})
		}, func(f figures) bool { return f.OverCommitted == 1 }},
		{"free milli that disagrees with the allocations is miscounted", func(o *observation) { o.GPUs[1].FreeMilli = 750 },
			func(f figures) bool { return f.Miscounted == 1 && f.OverCommitted == 0 }},
		{"two workloads of one rental run twice", func(o *observation) { o.Workloads["r1"] = 2 },
			func(f figures) bool { return f.RunningTwice == 1 }},
		{"a workload alive after its run stopped runs twice", func(o *observation) { o.Workloads["r2"] = 1 },
			func(f figures) bool { return f.RunningTwice == 1 }},
		{"a healthy rental moved is evicted", func(o *observation) { o.Migrating["r1"] = 1 },
			func(f figures) bool { return f.Evicted == 1 && f.settled() }},
		{"a move off a faulted node is no eviction", func(o *observation) { o.Migrating["r1"], o.FaultedNodes["n1"] = 1, true },
			func(f figures) bool { return f.Evicted == 0 }},
		{"a run stopped as cancelled that its tenant never cancelled is evicted", func(o *observation) {
			o.Runs[0].Stopped, o.Runs[0].Exit = t0.Add(10*time.Second), shizuv1.ExitReason_EXIT_REASON_CANCELLED
		}, func(f figures) bool { return f.Evicted == 1 }},
		{"a run its tenant cancelled is no eviction", func(o *observation) {
			o.Runs[0].Stopped, o.Runs[0].Exit, o.Cancelled["r1"] = t0.Add(10*time.Second), shizuv1.ExitReason_EXIT_REASON_CANCELLED, true
		}, func(f figures) bool { return f.Evicted == 0 }},
		{"a run failed on a healthy node is evicted", func(o *observation) { o.Runs[1].Exit = shizuv1.ExitReason_EXIT_REASON_NODE_FAILED },
			func(f figures) bool { return f.Evicted == 1 }},
		{"a preemption outside a preemption scenario is an eviction", func(o *observation) {
			o.Runs[1].Exit = shizuv1.ExitReason_EXIT_REASON_PREEMPTED
			o.Preempted = []preemption{{Victim: "r2", Preemptor: "r1", Deadline: t0.Add(5 * time.Second)}}
		}, func(f figures) bool { return f.Evicted == 1 && f.Preempted == 1 }},
		{"a second missing is unbilled", func(o *observation) { o.Usage[1].Seconds = 5 },
			func(f figures) bool { return f.Unbilled == 1 && f.DoubleBilled == 0 && !f.billed() }},
		{"a second too many is double-billed", func(o *observation) { o.Usage[1].Seconds = 7 },
			func(f figures) bool { return f.DoubleBilled == 1 && f.Unbilled == 0 }},
		{"a record outside every run is double-billed", func(o *observation) {
			o.Usage = append(o.Usage, usageRecord{ID: "u3", Rental: "r2", Node: "n2", Start: t0, Seconds: 3})
		}, func(f figures) bool { return f.DoubleBilled == 3 }},
		{"a run stamped before its placement is billed from the placement for its length", func(o *observation) {
			o.PlacedAt[placementKey("r2", 1)] = t0.Add(time.Hour) // r2's node runs an hour behind
			o.Usage[1].Start, o.Usage[1].End = t0.Add(time.Hour), t0.Add(time.Hour+5200*time.Millisecond)
		}, func(f figures) bool { return f.billed() && f.RunSeconds == 6 }},
		{"a run stamped before its placement and billed from its stamp is double-billed", func(o *observation) {
			o.PlacedAt[placementKey("r2", 1)] = t0.Add(time.Hour)
		}, func(f figures) bool { return f.DoubleBilled == 6 && f.Unbilled == 6 }},
		{"billing is not judged before every run stopped", func(o *observation) { o.Billing = false; o.Usage = nil },
			func(f figures) bool { return f.billed() && f.RunSeconds == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanObservation()
			tc.break_(&o)
			if f := judge(o); !tc.check(f) {
				t.Fatalf("figures %+v", f)
			}
		})
	}
}

func TestPreemptionFiguresCountVictimsOnceAndTheirDelayPastTheNotice(t *testing.T) {
	o := cleanObservation()
	o.Preemption = true
	o.Scheduled["v1"] = map[int32]string{1: "n1"}
	o.Runs = append(o.Runs, runSegment{Rental: "v1", Attempt: 1, Node: "n1", Started: t0,
		Stopped: t0.Add(6500 * time.Millisecond), Exit: shizuv1.ExitReason_EXIT_REASON_PREEMPTED})
	o.Usage = append(o.Usage, usageRecord{ID: "u4", Rental: "v1", Node: "n1", Start: t0, Seconds: 7})
	o.Preempted = []preemption{{Victim: "v1", Preemptor: "r1", At: t0.Add(time.Second), Deadline: t0.Add(6 * time.Second)}}
	f := judge(o)
	if f.Preempted != 1 || f.PreemptedTwice != 0 || f.PreemptorsUnplaced != 0 || f.Evicted != 0 || f.PreemptionLate != 500*time.Millisecond {
		t.Fatalf("figures %+v", f)
	}
	o.Preempted = append(o.Preempted, preemption{Victim: "v1", Preemptor: "r9", Deadline: t0.Add(7 * time.Second)})
	if f := judge(o); f.PreemptedTwice != 1 || f.Preempted != 1 {
		t.Fatalf("a victim preempted for two rentals: %+v", f)
	}
	o.Preempted = []preemption{{Victim: "v1", Preemptor: "r1", At: t0.Add(time.Second), Deadline: t0.Add(7 * time.Second)}}
	if f := judge(o); f.PreemptedEarly != 1 || f.PreemptionLate != -500*time.Millisecond {
		t.Fatalf("a victim stopped before its deadline: %+v", f)
	}
	o.Preempted[0].Deadline = t0.Add(6 * time.Second)
	o.Preempted[0].Preemptor = "r9"
	if f := judge(o); f.PreemptorsUnplaced != 1 {
		t.Fatalf("an unplaced preemptor: %+v", f)
	}
}
