package round_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// The harness of a scheduling round: each test drives round.Plan with a
// view, jobs and a fixed now, and asserts on the plan.

func TestARoundTriesReservedThenOnDemandThenSpotAndReservesWhatFits(t *testing.T) {
	t.Parallel()
	v := viewOf(node("n1", 1))
	plan := round.Plan(v, []*round.Job{job(t, "s", spot), job(t, "o"), job(t, "r", reserved)}, t0, config(t), nil)
	if got := ids(plan.Order); !slices.Equal(got, []string{"r", "o", "s"}) {
		t.Fatalf("order %v, want reserved, on-demand, spot", got)
	}
	if got := ids(plan.Reserve); !slices.Equal(got, []string{"r"}) {
		t.Fatalf("reserved %v, want the reserved rental on the one GPU", got)
	}
	if r := plan.Reserve[0]; r.Placed.NodeID != "n1" || r.Placed.Epoch != 3 || len(r.Placed.GPUs) != 1 {
		t.Fatalf("placement %+v", r.Placed)
	}
	if n, _ := v.Node("n1"); len(n.Allocations) != 1 || n.GPUs[0].FreeMilli != 0 {
		t.Fatalf("the view does not hold the round's reservation: %+v", n)
	}
	if got := ids(pendingJobs(plan.Pending)); !slices.Equal(got, []string{"o", "s"}) {
		t.Fatalf("pending %v, want the others waiting in order", got)
	}
}

func TestARoundPlacesEachPlacementOnceAndLeavesItsRepeatsToTheNextRound(t *testing.T) {
	t.Parallel()
	moved := job(t, "a", func(j *round.Job) { j.Attempt = 2 })
	plan := round.Plan(viewOf(node("n1", 4)), []*round.Job{job(t, "a"), job(t, "a"), moved, job(t, "b")}, t0, config(t), nil)
	if got := ids(plan.Reserve); len(got) != 3 {
		t.Fatalf("reserved %v, want a (attempt 1), a (attempt 2) and b", got)
	}
	if len(plan.Again) != 1 || plan.Again[0].Request.ID != "a" || plan.Again[0].Attempt != 1 {
		t.Fatalf("again %+v, want the repeat of a's first attempt", plan.Again)
	}
}

func TestARequestThatFitsNowhereWaitsForCapacityUntilItsDeadline(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	plan := round.Plan(viewOf(node("n1", 1)), []*round.Job{job(t, "big", func(j *round.Job) { j.Request.GPUCount = 2 })}, now, config(t), nil)
	if len(plan.Reserve) != 0 || len(plan.Reject) != 0 || len(plan.Pending) != 1 {
		t.Fatalf("plan %+v, want one pending", plan)
	}
	p := plan.Pending[0]
	if p.Reason != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY || p.Preempt != nil || !p.PreemptUntil.IsZero() {
		t.Fatalf("pending %+v, want waiting for capacity", p)
	}
	if !p.Shortage() || p.Missing.GPUCount == 0 {
		t.Fatalf("pending %+v, want a capacity shortage naming the missing GPUs", p)
	}
	if want := t0.Add(10 * time.Minute); !p.Job.Deadline.Equal(want) || !plan.NextDeadline.Equal(want) {
		t.Fatalf("deadline %s, next %s; want %s (made at t0, 10 min timeout)", p.Job.Deadline, plan.NextDeadline, want)
	}
	if p.Message() != "waiting for capacity: 2 GPU(s) of 1000 milli" {
		t.Fatalf("message %q", p.Message())
	}
}

func TestAnOnDemandRequestThatFitsOnlyWithoutSpotRentalsPreemptsThem(t *testing.T) {
	t.Parallel()
	v := viewOf(node("n1", 1))
	cfg := config(t)
	if first := round.Plan(v, []*round.Job{job(t, "cheap", spot)}, t0, cfg, nil); len(first.Reserve) != 1 {
		t.Fatalf("the spot rental was not placed: %+v", first)
	}
	now := t0.Add(time.Minute)
	plan := round.Plan(v, []*round.Job{job(t, "urgent", madeAt(now))}, now, cfg, nil)
	if len(plan.Pending) != 1 {
		t.Fatalf("plan %+v, want the on-demand request waiting", plan)
	}
	p := plan.Pending[0]
	if p.Reason != shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION || p.Shortage() {
		t.Fatalf("pending %+v, want awaiting preemption and no shortage", p)
	}
	if p.Preempt == nil || p.Preempt.NodeID != "n1" || p.Preempt.NodeEpoch != 3 || len(p.Preempt.Victims) != 1 ||
		p.Preempt.Victims[0].RentalID != "cheap" {
		t.Fatalf("preemption %+v, want the spot rental on n1 evicted", p.Preempt)
	}
	if !p.Preempt.NoticeDeadline.Equal(now.Add(30*time.Second)) || !p.PreemptUntil.Equal(now.Add(time.Minute)) {
		t.Fatalf("notice until %s, preempt until %s; want now+notice and now+2·notice", p.Preempt.NoticeDeadline, p.PreemptUntil)
	}
	// A spot request never preempts another spot rental.
	if again := round.Plan(v, []*round.Job{job(t, "other", spot, madeAt(now))}, now, cfg, nil); again.Pending[0].Preempt != nil {
		t.Fatalf("a spot request preempts: %+v", again.Pending[0].Preempt)
	}
}

func TestWhatAPendingRequestIsToldAgain(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	noCapacity := shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY
	awaiting := shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
	cases := []struct {
		name        string
		edit        func(*round.Job)
		wantPending bool
		wantReason  shizuv1.PendingReason
	}{
		{"a pending request told the same before says nothing new",
			func(j *round.Job) { j.FromPending, j.Reason = true, noCapacity }, false, 0},
		{"a pending request whose preemption is under way waits for it without starting another",
			func(j *round.Job) {
				j.FromPending, j.Reason, j.PreemptUntil = true, noCapacity, now.Add(10*time.Second)
			}, true, awaiting},
		{"a pending request told it awaits a preemption that is still under way says nothing new",
			func(j *round.Job) { j.FromPending, j.Reason, j.PreemptUntil = true, awaiting, now.Add(10*time.Second) }, false, 0},
		{"a pending request whose preemption notice ran out waits for capacity again",
			func(j *round.Job) { j.FromPending, j.Reason, j.PreemptUntil = true, awaiting, now.Add(-time.Second) }, true, noCapacity},
		{"a request decided meanwhile (a duplicate) says nothing",
			func(j *round.Job) { j.Decided = true }, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := job(t, "big", func(j *round.Job) { j.Request.GPUCount = 2 }, tc.edit)
			plan := round.Plan(viewOf(node("n1", 1)), []*round.Job{j}, now, config(t), nil)
			if len(plan.Reject) != 0 || len(plan.Pending) != map[bool]int{true: 1, false: 0}[tc.wantPending] {
				t.Fatalf("plan %+v", plan.NoFit)
			}
			if tc.wantPending && (plan.Pending[0].Reason != tc.wantReason || plan.Pending[0].Preempt != nil) {
				t.Fatalf("pending %+v, want reason %v and no new preemption", plan.Pending[0], tc.wantReason)
			}
			if !tc.wantPending && !plan.NextDeadline.IsZero() {
				t.Fatalf("next deadline %s for a request with nothing to say", plan.NextDeadline)
			}
		})
	}
}

func TestARequestPastItsDeadlineIsRejectedOnlyWhenItStillFitsNowhere(t *testing.T) {
	t.Parallel()
	now := t0.Add(11 * time.Minute)
	plan := round.Plan(viewOf(node("n1", 1)), []*round.Job{job(t, "fits"), job(t, "late", func(j *round.Job) { j.Request.GPUCount = 2 })}, now, config(t), nil)
	if got := ids(plan.Reserve); !slices.Equal(got, []string{"fits"}) {
		t.Fatalf("reserved %v: a late request that fits is placed", got)
	}
	if len(plan.Pending) != 0 || len(plan.Reject) != 1 {
		t.Fatalf("plan %+v, want the late one rejected", plan.NoFit)
	}
	r := plan.Reject[0]
	if r.Job.Request.ID != "late" || r.Reason != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT ||
		r.Message != "no capacity for 2 GPU(s) of 1000 milli within 10m0s" {
		t.Fatalf("reject %+v", r)
	}
}

func TestARequestNoNodeCouldEverTakeIsInvalid(t *testing.T) {
	t.Parallel()
	plan := round.Plan(viewOf(node("n1", 1)), []*round.Job{job(t, "none", func(j *round.Job) { j.Request.GPUCount = 0 })}, t0, config(t), nil)
	if len(plan.Invalid) != 1 || len(plan.Pending)+len(plan.Reserve)+len(plan.Reject) != 0 {
		t.Fatalf("plan %+v, want it invalid and nothing else", plan)
	}
}

func TestAdmission(t *testing.T) {
	t.Parallel()
	valid := func() *shizuv1.RentalRequested { return job(t, "r1").Event }
	cases := []struct {
		name       string
		edit       func(*shizuv1.RentalRequested, *placement.Request)
		wantReject string
		wantErr    bool
	}{
		{"a valid request goes to the next round", func(*shizuv1.RentalRequested, *placement.Request) {}, "", false},
		{"a spec that fails validation is rejected with the reason",
			func(ev *shizuv1.RentalRequested, _ *placement.Request) { ev.Spec.MilliGpu = 1500 }, "milli_gpu", false},
		{"a spec the catalogue cannot place is rejected with the reason",
			func(_ *shizuv1.RentalRequested, r *placement.Request) { r.Models = []string{"no-such-gpu"} }, "no-such-gpu", false},
		{"a request whose ids are unusable is refused, not answered",
			func(ev *shizuv1.RentalRequested, _ *placement.Request) { ev.Spec.MilliGpu, ev.RentalId = 1500, "" }, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev := valid()
			r := job(t, "r1").Request
			tc.edit(ev, &r)
			reject, err := round.Admit(ev, &r, placement.DefaultCatalogue(), round.Config{})
			if tc.wantErr != (err != nil) || (err != nil && !fault.IsInvalid(err)) {
				t.Fatalf("err %v, want an invalid error: %v", err, tc.wantErr)
			}
			if (tc.wantReject == "") != (reject == "") || !strings.Contains(reject, tc.wantReject) {
				t.Fatalf("reject %q, want one naming %q", reject, tc.wantReject)
			}
		})
	}
}

func pendingJobs(ps []round.Pending[*round.Job]) []*round.Job {
	out := make([]*round.Job, len(ps))
	for i, p := range ps {
		out[i] = p.Job
	}
	return out
}

func TestAnOnDemandRequestPreemptsTheSpotRentalThatLosesTheLeastWork(t *testing.T) {
	t.Parallel()
	v := viewOf(node("n1", 1), node("n2", 1))
	cfg := config(t)
	round.Plan(v, []*round.Job{job(t, "old", spot)}, t0, cfg, nil)
	later := t0.Add(30 * time.Minute)
	round.Plan(v, []*round.Job{job(t, "new", spot, madeAt(later))}, later, cfg, nil)
	now := later.Add(time.Minute)
	plan := round.Plan(v, []*round.Job{job(t, "urgent", madeAt(now))}, now, cfg, nil)
	if p := plan.Pending[0].Preempt; p == nil || len(p.Victims) != 1 || p.Victims[0].RentalID != "new" {
		t.Fatalf("preemption %+v, want the spot rental that ran 1 min evicted, not the one that ran 31", p)
	}
}

func TestAPendingRequestIsPlacedOnceTheViewHasRoom(t *testing.T) {
	t.Parallel()
	waiting := job(t, "w", func(j *round.Job) {
		j.FromPending, j.Reason = true, shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY
	})
	plan := round.Plan(viewOf(node("n1", 1)), []*round.Job{waiting}, t0.Add(5*time.Minute), config(t), nil)
	if len(plan.Reserve) != 1 || len(plan.Pending) != 0 {
		t.Fatalf("plan %+v, want the pending request reserved", plan)
	}
}

func TestNothingIsPlacedOnAnUnhealthyGPU(t *testing.T) {
	t.Parallel()
	n := node("n1", 2)
	n.GPUs[0].Unhealthy = true
	v := viewOf(n)
	plan := round.Plan(v, []*round.Job{job(t, "a"), job(t, "b")}, t0, config(t), nil)
	if len(plan.Reserve) != 1 || plan.Reserve[0].Placed.GPUs[0].Index != 1 || len(plan.Pending) != 1 {
		t.Fatalf("plan %+v, want one rental on GPU 1 and the other waiting", plan)
	}
}
