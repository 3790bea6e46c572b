package redisstore_test

import (
	"reflect"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestAGuardedStoreRefusesEveryBillingWriteUntilItsMarkerIsBack(t *testing.T) {
	t.Parallel()
	redis := testkit.StartRedis(t)
	raw := redisstore.New(redis.Client(t), "")
	s := raw.Guarded()
	ctx := t.Context()
	ref := ledger.SegmentRef{RentalID: "r-1", Attempt: 1}
	start := ledger.StartedEvent(ref, "node-1", t0, t0.Add(time.Minute))
	writes := map[string]func() error{
		"merge":   func() error { _, err := s.MergeSegments(ctx, []ledger.SegmentEvent{start}); return err },
		"advance": func() error { return s.AdvanceAll(ctx, []ledger.Advance{{Ref: ref, Cursor: t0, Due: t0}}) },
		"lost":    func() error { return s.Lost(ctx, "r-1", 1, t0) },
		"drop":    func() error { _, err := s.DropParked(ctx, ref); return err },
		"apply":   func() error { _, err := s.Apply(ctx, "", usage("usage:r-1:a", 5)); return err },
		"applyAll": func() error {
			_, err := s.ApplyAll(ctx, "", []*shizuv1.UsageRecorded{usage("usage:r-1:b", 5)})
			return err
		},
	}
	for name, write := range writes {
		if err := write(); !redisstore.IsLost(err) {
			t.Fatalf("%s without the marker: %v, want the store reported lost", name, err)
		}
	}
	if keys := redis.Client(t).Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Fatalf("refused writes left keys %v", keys)
	}
	if ok, err := s.Ready(ctx); ok || err != nil {
		t.Fatalf("ready %v (%v) before the marker", ok, err)
	}
	if err := raw.MarkReady(ctx, t0); err != nil {
		t.Fatal(err)
	}
	for name, write := range writes {
		if err := write(); err != nil {
			t.Fatalf("%s with the marker: %v", name, err)
		}
	}
	// The unguarded store never checks: a rebuild writes through it.
	redis.Restart(t)
	if _, err := raw.MergeSegments(ctx, []ledger.SegmentEvent{start}); err != nil {
		t.Fatalf("unguarded merge: %v", err)
	}
	if _, err := s.MergeSegments(ctx, []ledger.SegmentEvent{start}); !redisstore.IsLost(err) {
		t.Fatalf("guarded merge after a restart: %v, want the store reported lost", err)
	}
}

func TestTheRebuildLockHasOneOwnerAtATime(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	if ok, err := s.LockRebuild(ctx, "a", time.Minute); !ok || err != nil {
		t.Fatalf("first lock %v %v", ok, err)
	}
	if ok, _ := s.LockRebuild(ctx, "b", time.Minute); ok {
		t.Fatal("a second owner took a held lock")
	}
	if err := s.UnlockRebuild(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.LockRebuild(ctx, "b", time.Minute); ok {
		t.Fatal("another owner's unlock released the lock")
	}
	_ = s.UnlockRebuild(ctx, "a")
	if ok, _ := s.LockRebuild(ctx, "b", time.Minute); !ok {
		t.Fatal("the lock was not released by its owner")
	}
}

func TestARestoredSegmentLoadsAsTheReplayedState(t *testing.T) {
	t.Parallel()
	s := redisstore.New(testkit.StartRedis(t).Client(t), "")
	ctx := t.Context()
	max := pricing.Money{Micros: 900_000, Currency: "USD"}
	running := ledger.SegmentState{RentalID: "r-1", Attempt: 2, Scheduled: true, TenantID: "acme", NodeID: "node-1",
		Plan: shizuv1.Plan_PLAN_SPOT, Model: "H100-SXM5-80GB", Zone: "eu-1", GPUCount: 2, MilliGPU: 1000,
		Labels: map[string]string{"team": "nlp"}, MaxSpot: &max, StartNode: "node-1", StartedAt: t0, Cursor: t0.Add(3 * time.Minute),
		LostAt: t0.Add(4 * time.Minute)}
	stopped := ledger.SegmentState{RentalID: "r-2", Attempt: 1, Scheduled: true, TenantID: "acme", NodeID: "node-2",
		Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", GPUCount: 1, MilliGPU: 500, Labels: map[string]string{},
		StartNode: "node-2", StartedAt: t0, StoppedStartedAt: t0, StoppedAt: t0.Add(time.Minute),
		ExitReason: shizuv1.ExitReason_EXIT_REASON_COMPLETED, Cursor: t0.Add(time.Minute), Done: true}
	parked := ledger.SegmentState{RentalID: "r-3", Attempt: 1, StartNode: "node-3", NodeID: "node-3", StartedAt: t0}
	due := t0.Add(4*time.Minute + 30*time.Second)
	segs := []ledger.Restored{{State: running, Due: ledger.DueEntry{Listed: true, At: due}, Known: true},
		{State: stopped, Known: true}, {State: parked, Due: ledger.DueEntry{Listed: true, At: t0.Add(time.Minute)}, Known: true}}
	losses := []ledger.LossMark{{RentalID: "r-1", Attempt: 2, LastHeartbeat: running.LostAt}}
	for range 2 { // a second restore changes nothing
		if err := s.Restore(ctx, segs, losses); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range segs {
		ref := ledger.SegmentRef{RentalID: r.State.RentalID, Attempt: r.State.Attempt}
		got, err := mergeOne(ctx, s, ledger.SegmentEvent{Ref: ref})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r.State) {
			t.Fatalf("%v loads as\n%+v\nwant\n%+v", ref, got, r.State)
		}
		if att, _ := s.Attempts(ctx, ref.RentalID); len(att) != 1 || att[0] != ref.Attempt {
			t.Fatalf("%v attempts %v", ref, att)
		}
	}
	listed, err := s.Due(ctx, t0.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 2 || listed[0].RentalID != "r-3" || listed[1].RentalID != "r-1" {
		t.Fatalf("due list %v, want the parked r-3 then the running r-1 (the finished r-2 off it)", listed)
	}
	if at, _ := s.Due(ctx, due.Add(-time.Second), 10); len(at) != 1 {
		t.Fatalf("running segment listed before its due time: %v", at)
	}
}
