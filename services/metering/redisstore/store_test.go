package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

var t0 = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)

func usage(id string, micros int64) *shizuv1.UsageRecorded {
	return &shizuv1.UsageRecorded{Meta: &shizuv1.EventMeta{EventId: id}, TenantId: "acme", RentalId: "r-1",
		Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", IntervalStart: timestamppb.New(t0), Seconds: 10,
		GpuCount: 2, MilliGpu: 1000, Amount: &shizuv1.Money{Micros: micros, Currency: "USD"}, Labels: map[string]string{"team": "nlp"}}
}

// mergeOne merges one event and returns its segment's state.
func mergeOne(ctx context.Context, s *redisstore.Store, ev ledger.SegmentEvent) (ledger.SegmentState, error) {
	states, err := s.MergeSegments(ctx, []ledger.SegmentEvent{ev})
	if err != nil {
		return ledger.SegmentState{}, err
	}
	return states[0], nil
}

func TestConcurrentCallersSharePipelinesAndEachGetsItsOwnAnswer(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := usage(fmt.Sprintf("usage:r-%d:a", i), int64(i+1))
			rec.TenantId = fmt.Sprintf("t-%d", i)
			applied, err := s.Apply(ctx, "", rec)
			if err != nil {
				errs <- err
				return
			}
			if !applied.New || applied.MonthAfter != int64(i+1) {
				errs <- fmt.Errorf("tenant t-%d got %+v, want its own record of %d µ", i, applied, i+1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestApplyingARecordTwiceCountsItOnce(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	first, err := s.Apply(ctx, "", usage("usage:r-1:a", 700))
	if err != nil || !first.New || first.MonthBefore != 0 || first.MonthAfter != 700 {
		t.Fatalf("first apply %+v (%v)", first, err)
	}
	again, err := s.Apply(ctx, "", usage("usage:r-1:a", 700))
	if err != nil || again.New {
		t.Fatalf("second apply %+v (%v)", again, err)
	}
	micros, mgs, _ := s.Rental(ctx, "r-1")
	if micros != 700 || mgs != 20_000 {
		t.Fatalf("rental holds %d µ / %d mGs, want 700 / 20000", micros, mgs)
	}
}

func TestScriptsStillRunAfterRedisLosesItsScriptCache(t *testing.T) {
	t.Parallel()
	r := testkit.StartRedis(t)
	s := redisstore.New(r.Client(t), "")
	ctx := t.Context()
	if _, err := s.Apply(ctx, "", usage("usage:r-1:a", 5)); err != nil {
		t.Fatal(err)
	}
	r.Restart(t) // a fresh server: no data, no scripts
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := s.Apply(ctx, "", usage("usage:r-1:b", 5))
		return err
	})
	st, err := mergeOne(ctx, s, ledger.StoppedEvent(ledger.SegmentRef{RentalID: "r-2", Attempt: 1}, t0, t0.Add(time.Minute), shizuv1.ExitReason_EXIT_REASON_COMPLETED))
	if err != nil || !st.StoppedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("stopped after restart: %+v (%v)", st, err)
	}
}

func TestTheEarliestLostHeartbeatWinsWhateverTheOrder(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	ref := ledger.SegmentRef{RentalID: "r-1", Attempt: 1}
	if _, err := mergeOne(ctx, s, ledger.ScheduledEvent(ledger.SegmentState{RentalID: "r-1", Attempt: 1, TenantID: "acme", NodeID: "node-1",
		Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", GPUCount: 1, MilliGPU: 1000})); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{t0.Add(2 * time.Minute), t0.Add(time.Minute), t0.Add(3 * time.Minute)} {
		if err := s.Lost(ctx, "r-1", 1, at); err != nil {
			t.Fatal(err)
		}
	}
	st, err := mergeOne(ctx, s, ledger.SegmentEvent{Ref: ref})
	if err != nil || !st.LostAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("lost at %s, want the earliest report (%v)", st.LostAt, err)
	}
}

func TestALossEndsOnlyThePlacementItWasReportedFor(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	for _, a := range []int32{1, 2} {
		if _, err := mergeOne(ctx, s, ledger.ScheduledEvent(ledger.SegmentState{RentalID: "r-1", Attempt: a, TenantID: "acme", NodeID: "node-1",
			Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", GPUCount: 1, MilliGPU: 1000})); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Lost(ctx, "r-1", 1, t0); err != nil {
		t.Fatal(err)
	}
	// Attempt 2 runs on the same node again, after the loss.
	st, err := mergeOne(ctx, s, ledger.StartedEvent(ledger.SegmentRef{RentalID: "r-1", Attempt: 2}, "node-1", t0.Add(time.Minute), t0.Add(2*time.Minute)))
	if err != nil || !st.LostAt.IsZero() || !st.End().IsZero() {
		t.Fatalf("attempt 2 inherited attempt 1's loss: lost %s end %s (%v)", st.LostAt, st.End(), err)
	}
}

// A batch merges the events of many segments in one call: each segment
// gets its own events in order (the first start wins), a ref with no
// change is only loaded, and the states come back in first-seen order.
func TestMergingABatchGivesEachSegmentItsOwnEvents(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	s := redisstore.New(rdb, "")
	ctx := t.Context()
	a := ledger.SegmentRef{RentalID: "r-a", Attempt: 1}
	b := ledger.SegmentRef{RentalID: "r-b", Attempt: 2}
	c := ledger.SegmentRef{RentalID: "r-c", Attempt: 1}
	sched := ledger.ScheduledEvent(ledger.SegmentState{RentalID: "r-b", Attempt: 2, TenantID: "acme", NodeID: "node-2",
		Plan: shizuv1.Plan_PLAN_SPOT, Model: "H100-SXM5-80GB", Zone: "eu-1", GPUCount: 4, MilliGPU: 1000, Labels: map[string]string{"team": "nlp"}})
	states, err := s.MergeSegments(ctx, []ledger.SegmentEvent{
		ledger.StartedEvent(a, "node-1", t0, t0.Add(time.Minute)),
		sched,
		ledger.StartedEvent(a, "node-9", t0.Add(time.Hour), t0.Add(time.Hour)), // a later start report loses
		ledger.StoppedEvent(b, t0, t0.Add(90*time.Second), shizuv1.ExitReason_EXIT_REASON_COMPLETED),
		{Ref: c}, // only loaded
		ledger.StoppedEvent(a, t0, t0.Add(30*time.Second), shizuv1.ExitReason_EXIT_REASON_CANCELLED),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 3 || states[0].RentalID != "r-a" || states[1].RentalID != "r-b" || states[2].RentalID != "r-c" {
		t.Fatalf("states %+v, want r-a, r-b, r-c", states)
	}
	if sa := states[0]; !sa.StartedAt.Equal(t0) || sa.NodeID != "node-1" || !sa.StoppedAt.Equal(t0.Add(30*time.Second)) || sa.Scheduled {
		t.Fatalf("r-a: %+v", sa)
	}
	if sb := states[1]; !sb.Scheduled || sb.GPUCount != 4 || sb.Labels["team"] != "nlp" || !sb.StoppedAt.Equal(t0.Add(90*time.Second)) || !sb.StartedAt.IsZero() {
		t.Fatalf("r-b: %+v", sb)
	}
	if sc := states[2]; sc.Scheduled || !sc.StartedAt.IsZero() {
		t.Fatalf("r-c was only loaded, yet %+v", sc)
	}
	attempts, err := s.Attempts(ctx, "r-b")
	if err != nil || len(attempts) != 1 || attempts[0] != 2 {
		t.Fatalf("attempts of r-b %v (%v), want [2]", attempts, err)
	}
	if err := s.AdvanceAll(ctx, []ledger.Advance{
		{Ref: a, Cursor: t0.Add(30 * time.Second), Finished: true},
		{Ref: b, Cursor: t0.Add(time.Minute), Due: t0.Add(2 * time.Minute)},
	}); err != nil {
		t.Fatal(err)
	}
	due, err := s.Due(ctx, t0.Add(time.Hour), 10)
	if err != nil || len(due) != 1 || due[0] != b {
		t.Fatalf("due %v (%v), want only r-b (r-a finished)", due, err)
	}
}

// A record repeated inside one batch is applied once, and a repeat reports
// the month's spend as it is.
func TestApplyingABatchCountsEachRecordIdOnce(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	got, err := s.ApplyAll(ctx, "", []*shizuv1.UsageRecorded{usage("usage:r-1:a", 700), usage("usage:r-1:b", 300), usage("usage:r-1:a", 700)})
	if err != nil {
		t.Fatal(err)
	}
	want := []redisstore.Applied{{New: true, MonthBefore: 0, MonthAfter: 700}, {New: true, MonthBefore: 700, MonthAfter: 1000},
		{New: false, MonthBefore: 1000, MonthAfter: 1000}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("applied %+v, want %+v", got, want)
		}
	}
	if total, err := s.TenantTotal(ctx, "acme", "USD"); err != nil || total != 1000 {
		t.Fatalf("tenant total %d (%v), want 1000", total, err)
	}
}

func TestAFinishedSegmentIsNeverDueAgain(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	ref := ledger.SegmentRef{RentalID: "r-f", Attempt: 1}
	stop := t0.Add(90 * time.Second)
	finish := ledger.Advance{Ref: ref, Cursor: stop, Finished: true}
	running := ledger.Advance{Ref: ref, Cursor: t0.Add(time.Minute), Due: t0.Add(2 * time.Minute)}
	due := func(when string) {
		t.Helper()
		refs, err := s.Due(ctx, t0.Add(time.Hour), 10_000)
		if err != nil || len(refs) != 0 {
			t.Fatalf("%s: due %v (%v), want nothing", when, refs, err)
		}
	}
	if _, err := mergeOne(ctx, s, ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if _, err := mergeOne(ctx, s, ledger.StoppedEvent(ref, t0, stop, shizuv1.ExitReason_EXIT_REASON_COMPLETED)); err != nil {
		t.Fatal(err)
	}
	if err := s.AdvanceAll(ctx, []ledger.Advance{finish}); err != nil {
		t.Fatal(err)
	}
	due("finished")
	// The closer's running advance lands after the stop's finishing one.
	if err := s.AdvanceAll(ctx, []ledger.Advance{running}); err != nil {
		t.Fatal(err)
	}
	due("late running advance")
	// Redelivered start and stop, one by one and in a batch.
	if _, err := mergeOne(ctx, s, ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	due("redelivered start")
	if _, err := s.MergeSegments(ctx, []ledger.SegmentEvent{
		ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute)),
		ledger.StoppedEvent(ref, t0, stop, shizuv1.ExitReason_EXIT_REASON_COMPLETED),
	}); err != nil {
		t.Fatal(err)
	}
	due("redelivered batch")
	st, err := mergeOne(ctx, s, ledger.SegmentEvent{Ref: ref})
	if err != nil || !st.Done || !st.Cursor.Equal(t0.Add(90*time.Second)) {
		t.Fatalf("segment %+v (%v), want done with its cursor at the stop", st, err)
	}
	// A segment whose start arrived before its schedule stays due.
	early := ledger.SegmentRef{RentalID: "r-early", Attempt: 1}
	if _, err := mergeOne(ctx, s, ledger.StartedEvent(early, "node-2", t0, t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if refs, err := s.Due(ctx, t0.Add(time.Hour), 10_000); err != nil || len(refs) != 1 || refs[0] != early {
		t.Fatalf("due %v (%v), want only %v", refs, err, early)
	}
}

func TestADaysAppliedRecordIdsExpireLongAfterItsLastRecord(t *testing.T) {
	t.Parallel()
	r := testkit.StartRedis(t)
	rdb := r.Client(t)
	s := redisstore.New(rdb, "")
	ctx := t.Context()
	if _, err := s.ApplyAll(ctx, "", []*shizuv1.UsageRecorded{usage("usage:r-1:a", 700), usage("usage:r-1:b", 300)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, "", usage("usage:r-1:a", 700)); err != nil {
		t.Fatal(err)
	}
	key := "mt:agg:0:seen:" + t0.Format(time.DateOnly)
	ids, err := rdb.SMembers(ctx, key).Result()
	if err != nil || len(ids) != 2 {
		t.Fatalf("%s holds %v (%v), want the two ids", key, ids, err)
	}
	ttl, err := rdb.TTL(ctx, key).Result()
	if err != nil || ttl <= redisstore.SeenRetention-24*time.Hour || ttl > redisstore.SeenRetention {
		t.Fatalf("%s expires in %s (%v), want about %s", key, ttl, err, redisstore.SeenRetention)
	}
	if micros, _, _ := s.Rental(ctx, "r-1"); micros != 1000 {
		t.Fatalf("rental holds %d µ, want 1000", micros)
	}
}
