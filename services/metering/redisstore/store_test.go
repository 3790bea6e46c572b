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

func TestConcurrentCallersSharePipelinesAndEachGetsItsOwnAnswer(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := redisstore.SegmentRef{RentalID: fmt.Sprintf("r-%d", i), Attempt: 1}
			at := t0.Add(time.Duration(i) * time.Second)
			st, err := s.Started(ctx, ref, "node-1", at, at)
			if err != nil {
				errs <- err
				return
			}
			if st.RentalID != ref.RentalID || !st.StartedAt.Equal(at) {
				errs <- fmt.Errorf("%s got the state of %s at %s", ref.RentalID, st.RentalID, st.StartedAt)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	due, err := s.Due(ctx, t0.Add(time.Hour), 10_000)
	if err != nil || len(due) != 1000 {
		t.Fatalf("%d segments due, want 1000 (%v)", len(due), err)
	}
}

func TestApplyingARecordTwiceCountsItOnce(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := context.Background()
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
	ctx := context.Background()
	if _, err := s.Apply(ctx, "", usage("usage:r-1:a", 5)); err != nil {
		t.Fatal(err)
	}
	r.Restart(t) // a fresh server: no data, no scripts
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := s.Apply(ctx, "", usage("usage:r-1:b", 5))
		return err
	})
	st, err := s.Stopped(ctx, redisstore.SegmentRef{RentalID: "r-2", Attempt: 1}, t0, t0.Add(time.Minute), shizuv1.ExitReason_EXIT_REASON_COMPLETED)
	if err != nil || !st.StoppedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("stopped after restart: %+v (%v)", st, err)
	}
}

func TestTheEarliestLostHeartbeatWinsWhateverTheOrder(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := context.Background()
	ref := redisstore.SegmentRef{RentalID: "r-1", Attempt: 1}
	if _, err := s.Scheduled(ctx, ledger.SegmentState{RentalID: "r-1", Attempt: 1, TenantID: "acme", NodeID: "node-1",
		Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", GPUCount: 1, MilliGPU: 1000}); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{t0.Add(2 * time.Minute), t0.Add(time.Minute), t0.Add(3 * time.Minute)} {
		if err := s.Lost(ctx, "r-1", 1, at); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Segment(ctx, ref)
	if err != nil || !st.LostAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("lost at %s, want the earliest report (%v)", st.LostAt, err)
	}
}

func TestALossEndsOnlyThePlacementItWasReportedFor(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := context.Background()
	for _, a := range []int32{1, 2} {
		if _, err := s.Scheduled(ctx, ledger.SegmentState{RentalID: "r-1", Attempt: a, TenantID: "acme", NodeID: "node-1",
			Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", GPUCount: 1, MilliGPU: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Lost(ctx, "r-1", 1, t0); err != nil {
		t.Fatal(err)
	}
	// Attempt 2 runs on the same node again, after the loss.
	st, err := s.Started(ctx, redisstore.SegmentRef{RentalID: "r-1", Attempt: 2}, "node-1", t0.Add(time.Minute), t0.Add(2*time.Minute))
	if err != nil || !st.LostAt.IsZero() || !st.End().IsZero() {
		t.Fatalf("attempt 2 inherited attempt 1's loss: lost %s end %s (%v)", st.LostAt, st.End(), err)
	}
}
