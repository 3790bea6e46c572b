package ledger_test

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

func TestAStopStampedBeforeItsStartEndsTheRunAtTheLastTrustedTime(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 2, 9, 0, 15, 0, time.UTC)
	ref := ledger.SegmentRef{RentalID: "r", Attempt: 1}
	list := ledger.Tariff{Base: pricing.Money{Micros: 3_600_000, Currency: "USD"}}
	rules := ledger.DefaultRules()
	scheduled := func(plan shizuv1.Plan) ledger.SegmentState {
		return ledger.SegmentState{RentalID: "r", Attempt: 1, Scheduled: true, TenantID: "t", NodeID: "n", Plan: plan,
			Model: "m", GPUCount: 1, MilliGPU: 1000}
	}
	cases := []struct {
		name        string
		plan        shizuv1.Plan
		exit        shizuv1.ExitReason
		stop        time.Time
		cursor      time.Time // billed before the stop arrived
		wantStepped bool
		wantRecords []int64 // seconds of the records the stop adds
		wantCursor  time.Time
	}{
		{"a consistent stop ends the run at its stamp", shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.ExitReason_EXIT_REASON_PREEMPTED,
			t0.Add(3*time.Minute + 10*time.Second), t0.Add(165 * time.Second), false, []int64{25}, t0.Add(3*time.Minute + 10*time.Second)},
		{"a stop before its start ends a run already billed at what was billed", shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.ExitReason_EXIT_REASON_COMPLETED,
			t0.Add(-10 * time.Second), t0.Add(165 * time.Second), true, nil, t0.Add(165 * time.Second)},
		{"a stop before its start ends a run not billed yet at its start", shizuv1.Plan_PLAN_SPOT, shizuv1.ExitReason_EXIT_REASON_COMPLETED,
			t0.Add(-10 * time.Second), time.Time{}, true, nil, t0},
		{"a run the tenant ended is still topped up to the minimum charge", shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.ExitReason_EXIT_REASON_COMPLETED,
			t0.Add(-time.Hour), time.Time{}, true, []int64{60}, t0.Add(time.Minute)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ev, stepped := ledger.TrustedStop(ref, t0, tc.stop, tc.exit)
			if stepped != tc.wantStepped {
				t.Fatalf("stepped = %v, want %v", stepped, tc.wantStepped)
			}
			st := scheduled(tc.plan)
			st, _ = ledger.Merge(st, ledger.DueEntry{}, ledger.StartedEvent(ref, "n", t0, t0))
			st.Cursor = tc.cursor
			st, due := ledger.Merge(st, ledger.DueEntry{}, ev)
			if !due.Listed || due.At.After(tc.stop) && due.At.After(t0) {
				t.Fatalf("due %+v: want the stop due at once", due)
			}
			seg, ok := st.Segment()
			if !ok || !seg.Ended() {
				t.Fatalf("segment %+v: want it ended", seg)
			}
			// However late the closer looks, the run bills only what the stop adds.
			recs, cursor, err := ledger.Close(seg, list, rules, st.Cursor, t0.Add(24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, r := range recs {
				got = append(got, r.Seconds)
			}
			if len(got) != len(tc.wantRecords) || (len(got) > 0 && got[0] != tc.wantRecords[0]) {
				t.Fatalf("records of %v seconds, want %v", got, tc.wantRecords)
			}
			if !cursor.Equal(tc.wantCursor) {
				t.Fatalf("cursor %s, want %s", cursor, tc.wantCursor)
			}
			st, _ = ledger.Advance{Ref: ref, Cursor: cursor, Finished: true}.Apply(st, due)
			if !st.Finished() {
				t.Fatalf("state %+v: want it finished", st)
			}
		})
	}
}
