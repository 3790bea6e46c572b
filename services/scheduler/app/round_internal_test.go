package app

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// What a round commits, records and publishes, driven with the fakes of
// the scheduler's ports, a view of plain nodes and a fixed clock.

var roundNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type rig struct {
	s   *Scheduler
	res *porttest.Reserver
	rec *porttest.Records
	pub *porttest.Publisher
}

// newRig is a scheduler on fakes whose view holds n1 (2 H100s, epoch 1),
// read just now, with H100x8 nodes to provision.
func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{res: porttest.NewReserver(porttest.FakeNode{ID: "n1", Epoch: 1, GPUs: 2}), rec: porttest.NewRecords(), pub: &porttest.Publisher{}}
	s, err := New(DefaultConfig(), Deps{Records: r.rec, Publisher: r.pub, Now: func() time.Time { return roundNow }})
	if err != nil {
		t.Fatal(err)
	}
	s.reserve = r.res
	// The autoscaler may provision H100x8 nodes: a request n1 cannot
	// hold waits for capacity rather than being unsatisfiable.
	s.plan.Offers = []placement.Offer{{Name: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8, Zones: []string{"zone-a"}}}
	n := placement.Node{ID: "n1", Epoch: 1, Ready: true, Zone: "zone-a", Market: rent.OnDemand,
		CPUMilli: 64_000, MemoryMiB: 1 << 18, FreeCPUMilli: 64_000, FreeMemoryMiB: 1 << 18}
	for i := range 2 {
		n.GPUs = append(n.GPUs, placement.GPU{Index: i, UUID: fmt.Sprintf("GPU-n1-%d", i), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, FreeMilli: 1000, FreeVRAMMiB: 80 * 1024})
	}
	s.view.Reset([]placement.Node{n}, 1, roundNow)
	r.s = s
	return r
}

// job is a request for gpus whole GPUs made at made.
func (r *rig) job(id string, gpus int32, made time.Time) *job {
	ev := &shizuv1.RentalRequested{
		Meta:     &shizuv1.EventMeta{EventId: "req:" + id, OccurredAt: timestamppb.New(made), Source: "test", CorrelationId: id},
		RentalId: id, TenantId: "tenant-a", Spec: &shizuv1.RentalSpec{GpuCount: gpus, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND},
	}
	return r.s.newJob(ev, requestOf(ev), 1)
}

// run runs one round and returns each job's outcome.
func (r *rig) run(t *testing.T, jobs ...*job) []error {
	t.Helper()
	r.s.round(t.Context(), jobs)
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		errs[i] = <-j.done
	}
	r.s.publishers.Wait()
	return errs
}

func TestARoundReservesItsPlacementsInOrderRecordsThemAndAnnouncesThem(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	if errs := r.run(t, r.job("r1", 1, roundNow), r.job("r2", 1, roundNow.Add(-time.Second))); errs[0] != nil || errs[1] != nil {
		t.Fatalf("outcomes %v", errs)
	}
	if len(r.res.Reserved) != 1 || len(r.res.Reserved[0]) != 2 || r.res.Reserved[0][0].RentalID != "r2" {
		t.Fatalf("reserved %+v, want r2 (older) then r1 in one call", r.res.Reserved)
	}
	if len(r.rec.Claims) != 1 || r.rec.Claims[0].Want != round.OutcomeScheduled || !slices.Equal(r.rec.Claims[0].Keys, []string{"r2", "r1"}) {
		t.Fatalf("claims %+v", r.rec.Claims)
	}
	sched := porttest.Events[*shizuv1.RentalScheduled](r.pub)
	starts := porttest.Events[*shizuv1.StartRental](r.pub)
	if len(sched) != 2 || len(starts) != 2 || sched[0].GetMeta().GetEventId() != "rental:r2:scheduled:1" ||
		sched[0].GetGpus()[0].GetGpuUuid() == "" || sched[0].GetZone() != "zone-a" || starts[0].GetMeta().GetEventId() != "cmd:start:r2:1" {
		t.Fatalf("scheduled %v, starts %v", sched, starts)
	}
	if len(r.res.Released) != 0 {
		t.Fatalf("released %v", r.res.Released)
	}
}

func TestARedeliveryThatFindsItsOwnReservationAnnouncesItAgainAndKeepsIt(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	first := r.res.ReserveMany(t.Context(), []capacity.Placement{{RentalID: "r1", NodeID: "n1", Epoch: 1, Tenant: "tenant-a",
		CPUMilli: 4000, MemoryMiB: 16 * 1024, GPUs: []capacity.GPUShare{{Index: 1, Milli: 1000}}}})[0].Allocation
	r.rec.SetOutcome("r1", round.OutcomeScheduled, ports.AllocToken(first))
	if errs := r.run(t, r.job("r1", 1, roundNow)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	sched := porttest.Events[*shizuv1.RentalScheduled](r.pub)
	if len(r.res.Released) != 0 || len(sched) != 1 || sched[0].GetGpus()[0].GetGpuIndex() != 1 {
		t.Fatalf("released %v, scheduled %v; want the stored allocation (GPU 1) announced and kept", r.res.Released, sched)
	}
	r.s.view.ApplyFixes()
	if n, _ := r.s.view.Node("n1"); len(n.Allocations) != 0 || !slices.Equal(r.s.view.TakeStale(), []string{"n1"}) {
		t.Fatalf("the view keeps the round's own placement (%d allocations) or does not re-read n1", len(n.Allocations))
	}
}

func TestAReservationOfARentalDecidedOtherwiseFirstIsGivenBack(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		outcome, with string
	}{
		{"a rental cancelled before its outcome was recorded", round.OutcomeCancelled, ""},
		{"a rental scheduled before on an allocation that is gone", round.OutcomeScheduled, "n1@1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.rec.SetOutcome("r1", tc.outcome, tc.with)
			if errs := r.run(t, r.job("r1", 1, roundNow)); errs[0] != nil {
				t.Fatal(errs[0])
			}
			if !slices.Equal(r.res.Released, []string{"r1"}) || len(porttest.Events[*shizuv1.RentalScheduled](r.pub)) != 0 {
				t.Fatalf("released %v, published %v; want the reservation given back and nothing announced", r.res.Released, r.pub.Published)
			}
			if _, err := r.res.Allocation(t.Context(), "r1"); !capacity.IsNotFound(err) {
				t.Fatalf("allocation after give-back: %v", err)
			}
		})
	}
}

// staleCommit is the loop's commit with the store reads left out: it
// records what the view holds when each pass ends.
type staleCommit struct {
	*roundCommit
	allocs []int
	stale  [][]string
}

func (c *staleCommit) Refresh(bool) bool {
	n, _ := c.s.view.Node("n1")
	c.allocs = append(c.allocs, len(n.Allocations))
	c.stale = append(c.stale, c.s.view.TakeStale())
	return false
}

func TestAReserveTheStoreRefusesLeavesTheViewMarksItsNodeStaleAndIsPlacedAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.res.Refuse["r1"] = fmt.Errorf("taken by another replica: %w", capacity.ErrInsufficient)
	c := &staleCommit{roundCommit: &roundCommit{s: r.s, ctx: t.Context()}}
	plan := round.Plan(r.s.view, []*job{r.job("r1", 1, roundNow), r.job("big", 3, roundNow)}, roundNow, r.s.plan, c)
	if len(c.allocs) != 2 || c.allocs[0] != 0 || !slices.Equal(c.stale[0], []string{"n1"}) {
		t.Fatalf("after the refusal the view holds %v allocations and re-reads %v; want none and n1, then a second pass", c.allocs, c.stale)
	}
	if len(plan.Reserve) != 1 || plan.Reserve[0].Request.ID != "r1" || plan.Reserve[0].err != nil || len(plan.Refused) != 0 {
		t.Fatalf("reserved %d, refused %d; want r1 reserved on the second pass", len(plan.Reserve), len(plan.Refused))
	}
	if len(r.res.Reserved) != 2 {
		t.Fatalf("reserve calls %+v, want the refused one and the second pass", r.res.Reserved)
	}
	if len(plan.Pending) != 1 || plan.Pending[0].Job.Request.ID != "big" {
		t.Fatalf("pending %+v, want big waiting", plan.Pending)
	}
}

func TestAReserveRefusedEveryPassIsLeftToBeTriedAgain(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	j := r.job("r1", 1, roundNow)
	c := &refuseAll{staleCommit: staleCommit{roundCommit: &roundCommit{s: r.s, ctx: t.Context()}}}
	r.s.decide(t.Context(), []*job{j}, roundNow, c)
	if err := <-j.done; !fault.IsUnavailable(err) {
		t.Fatalf("outcome %v, want unavailable (retried)", err)
	}
	r.s.publishers.Wait()
	if len(c.allocs) != round.MaxPasses {
		t.Fatalf("%d passes, want %d", len(c.allocs), round.MaxPasses)
	}
}

// refuseAll refuses every reserve.
type refuseAll struct{ staleCommit }

func (c *refuseAll) Reserve(j *job) { c.commit = append(c.commit, j) }

func (c *refuseAll) Settle() []*job {
	refused := c.commit
	c.commit = nil
	return refused
}

// decide runs one round with the store reads left out (staleCommit) and
// returns each job's outcome.
func (r *rig) decide(t *testing.T, jobs ...*job) []error {
	t.Helper()
	r.s.decide(t.Context(), jobs, roundNow, &staleCommit{roundCommit: &roundCommit{s: r.s, ctx: t.Context()}})
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		errs[i] = <-j.done
	}
	r.s.publishers.Wait()
	return errs
}

func TestRequestsThatFitNowhereAreStoredPendingOrRejectedAndAnnounced(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	waiting, late := r.job("wait", 3, roundNow.Add(-time.Minute)), r.job("late", 3, roundNow.Add(-11*time.Minute))
	if errs := r.decide(t, waiting, late); errs[0] != nil || errs[1] != nil {
		t.Fatalf("outcomes %v", errs)
	}
	entries, _, _ := r.rec.Pending(t.Context())
	if len(entries) != 1 || entries[0].Event.GetRentalId() != "wait" || entries[0].Reason != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY {
		t.Fatalf("pending set %+v", entries)
	}
	pend, short := porttest.Events[*shizuv1.RentalPending](r.pub), porttest.Events[*shizuv1.CapacityShortage](r.pub)
	if len(pend) != 1 || !pend[0].GetDeadline().AsTime().Equal(roundNow.Add(9*time.Minute)) || len(short) != 1 || short[0].GetMissing().GetGpuCount() == 0 {
		t.Fatalf("pending %v, shortages %v", pend, short)
	}
	rej := porttest.Events[*shizuv1.RentalRejected](r.pub)
	if len(rej) != 1 || rej[0].GetRentalId() != "late" || rej[0].GetReason() != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT {
		t.Fatalf("rejected %v", rej)
	}
	if !r.s.nextDeadline.Equal(roundNow.Add(9 * time.Minute)) {
		t.Fatalf("next deadline %s", r.s.nextDeadline)
	}
}

func TestRecordsThatFailLeaveEveryNoFitRequestToBeRetried(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.rec.Err = errors.New("records down")
	if errs := r.decide(t, r.job("wait", 3, roundNow), r.job("late", 3, roundNow.Add(-11*time.Minute))); !errors.Is(errs[0], r.rec.Err) || !errors.Is(errs[1], r.rec.Err) {
		t.Fatalf("outcomes %v, want the records' error for both", errs)
	}
	if len(r.pub.Published) != 0 {
		t.Fatalf("published %v, want nothing", r.pub.Published)
	}
}

func TestADuplicateOfAScheduledRentalThatFitsNowhereSaysNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.rec.SetOutcome("dup", round.OutcomeScheduled, "n1@1")
	if errs := r.decide(t, r.job("dup", 3, roundNow)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	entries, _, _ := r.rec.Pending(t.Context())
	if len(entries) != 0 || len(r.pub.Published) != 0 {
		t.Fatalf("pending %v, published %v; want nothing for a rental scheduled already", entries, r.pub.Published)
	}
}

func TestAFailureAfterPlacementLeavesTheRequestToBeDeliveredAgain(t *testing.T) {
	t.Parallel()
	down := errors.New("down")
	cases := []struct {
		name string
		fail func(*rig)
	}{
		{"the store's reserve fails for another reason than capacity", func(r *rig) { r.res.Refuse["r1"] = down }},
		{"the outcome records fail", func(r *rig) { r.rec.Err = down }},
		{"the events are not acknowledged", func(r *rig) { r.pub.WaitErr = down }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			tc.fail(r)
			if errs := r.run(t, r.job("r1", 1, roundNow)); !errors.Is(errs[0], down) {
				t.Fatalf("outcome %v, want the failure (the delivery is not acknowledged)", errs[0])
			}
		})
	}
}
