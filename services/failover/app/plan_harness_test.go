package app

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/app/failovertest"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// The plan harness: a replica on fakes and a fixed clock, driven with
// plain values; the tests assert on what it would commit (records,
// releases, events).

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type harness struct {
	f           *Failover
	now         time.Time
	placements  *failovertest.Placements
	moves       *failovertest.Moves
	quarantines *failovertest.Quarantines
	capacity    *failovertest.Capacity
	bus         *failovertest.Bus
}

func harnessConfig() Config {
	cfg := DefaultConfig()
	cfg.Tick = time.Second
	cfg.Detect.DisconnectGrace = 300 * time.Millisecond
	return cfg
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	det, err := detect.New(cfg.Detect)
	if err != nil {
		t.Fatal(err)
	}
	q, err := migrate.NewQueue(cfg.Pace)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{now: t0, placements: failovertest.NewPlacements(), moves: failovertest.NewMoves(),
		quarantines: failovertest.NewQuarantines(), capacity: failovertest.NewCapacity(), bus: failovertest.NewBus()}
	h.f = &Failover{cfg: cfg, d: Deps{Now: func() time.Time { return h.now }, Log: slog.New(slog.DiscardHandler), Source: "failover-test"},
		placements: h.placements, moves: h.moves, quarantines: h.quarantines, releases: h.capacity,
		newBatch: func() eventBatch { return h.bus.NewBatch() }, det: det, queue: q, wake: make(chan struct{}, 1)}
	h.f.ready.Store(true) // the fake records are never lost (rebuild.go)
	return h
}

// rent places rental on node n1 (attempt 1, as its RentalScheduled said).
func (h *harness) rent(t *testing.T, rental string, plan shizuv1.Plan) migrate.Allocation {
	t.Helper()
	h.capacity.Place(rental, "n1")
	if err := h.placements.Put(t.Context(), rental, migrate.Placement{Attempt: 1, Tenant: "acme", Node: "n1",
		Spec: &shizuv1.RentalSpec{Plan: plan, CheckpointUri: "s3://ckpt/" + rental}}); err != nil {
		t.Fatal(err)
	}
	return migrate.Allocation{Rental: rental, Tenant: "acme", GPUs: []int{0}}
}

func lossOf(node string) migrate.Order {
	return migrate.Order{Node: node, Epoch: 4, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST), Mode: migrate.ModeBreak,
		LastAlive: t0.Add(-3 * time.Second), LastBeat: t0.Add(-3 * time.Second), Decided: t0, Cause: nodeLostID(node, 4)}
}

// round hands over the moves due at h.now, as a tick does.
func (h *harness) round(t *testing.T) error {
	t.Helper()
	return h.f.moveAll(t.Context(), h.f.due(h.now, false), h.f.newBatch())
}

// delivered lists the events of type E delivered so far.
func delivered[E proto.Message](h *harness) []E {
	var out []E
	for _, e := range h.bus.Delivered() {
		if ev, ok := e.Message.(E); ok {
			out = append(out, ev)
		}
	}
	return out
}

func migratingRentals(h *harness) []string {
	var out []string
	for _, ev := range delivered[*shizuv1.RentalMigrating](h) {
		out = append(out, ev.GetRentalId())
	}
	return out
}

func (h *harness) record(t *testing.T, rental string) (migrate.Record, bool) {
	t.Helper()
	m, ok, err := h.moves.Get(t.Context(), rental)
	if err != nil {
		t.Fatal(err)
	}
	return m, ok
}

func TestAStormIsHandedOverReservedFirstAtThePace(t *testing.T) {
	t.Parallel()
	cfg := harnessConfig()
	cfg.Pace = migrate.Pace{PerSecond: 10, Burst: 2}
	h := newHarness(t, cfg)
	allocs := []migrate.Allocation{
		h.rent(t, "a-spot", shizuv1.Plan_PLAN_SPOT), h.rent(t, "b-od", shizuv1.Plan_PLAN_ON_DEMAND),
		h.rent(t, "c-res", shizuv1.Plan_PLAN_RESERVED), h.rent(t, "d-od", shizuv1.Plan_PLAN_ON_DEMAND),
		{Rental: "e-unknown", Tenant: "acme", GPUs: []int{1}}, // never seen scheduled
	}
	h.capacity.Place("e-unknown", "n1")
	if err := h.f.queueMoves(t.Context(), allocs, lossOf("n1")); err != nil {
		t.Fatal(err)
	}
	var rounds [][]string
	for _, after := range []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, time.Second} {
		h.now = t0.Add(after)
		before := len(migratingRentals(h))
		if err := h.round(t); err != nil {
			t.Fatal(err)
		}
		rounds = append(rounds, migratingRentals(h)[before:])
	}
	want := [][]string{{"c-res", "b-od"}, {}, {"d-od"}, {"a-spot", "e-unknown"}}
	if fmt.Sprint(rounds) != fmt.Sprint(want) {
		t.Fatalf("handed over %v per round, want %v (the burst, nothing before a token, one a tenth of a second)", rounds, want)
	}
	if held := h.capacity.Held("n1"); len(held) != 0 {
		t.Fatalf("n1 still holds %v", held)
	}
}

func TestAttemptsOfTheMovesHandedOver(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	allocs := []migrate.Allocation{h.rent(t, "known", shizuv1.Plan_PLAN_ON_DEMAND), h.rent(t, "moved-here", shizuv1.Plan_PLAN_ON_DEMAND),
		{Rental: "attempt-less", Tenant: "acme", GPUs: []int{2}}}
	h.capacity.Place("attempt-less", "n1")
	// moved-here came onto n1 as attempt 2 off n0; its RentalScheduled of
	// attempt 2 was not read before n1 died.
	prev := failovertest.Record("moved-here")
	prev.FromNode, prev.Published = "n0", true
	if err := h.moves.Put(t.Context(), prev); err != nil {
		t.Fatal(err)
	}
	o := lossOf("n1")
	o.StopOld = true // as a failed GPU's moves: the old runs are told to stop
	if err := h.f.queueMoves(t.Context(), allocs, o); err != nil {
		t.Fatal(err)
	}
	if err := h.round(t); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, ev := range delivered[*shizuv1.RentalMigrating](h) {
		ids[ev.GetRentalId()] = ev.GetMeta().GetEventId()
		if ev.GetRentalId() == "attempt-less" && (ev.GetSpec() != nil || ev.GetNextAttempt() != 0) {
			t.Errorf("the attempt-less move %v", ev)
		}
		if ev.GetRentalId() == "known" && ev.GetCheckpointUri() != "s3://ckpt/known" {
			t.Errorf("the move lacks its checkpoint: %v", ev)
		}
	}
	want := map[string]string{"known": "rental:known:migrating:2", "moved-here": "rental:moved-here:migrating:3",
		"attempt-less": "rental:attempt-less:migrating:n1:4"}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("event ids %v, want %v", ids, want)
	}
	var stopped []string
	for _, s := range delivered[*shizuv1.StopRental](h) {
		if s.GetReason() != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED || s.GetNodeId() != "n1" {
			t.Errorf("stop %v, want n1's run stopped for NODE_FAILED", s)
		}
		stopped = append(stopped, fmt.Sprintf("%s@%d", s.GetRentalId(), s.GetAttempt()))
	}
	slices.Sort(stopped)
	if want := []string{"known@1", "moved-here@2"}; !slices.Equal(stopped, want) {
		t.Fatalf("stopped %v, want %v (an attempt-less run has no attempt to stop)", stopped, want)
	}
}

func TestOneUnpublishableMoveDoesNotFailItsBatch(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		setup  func(h *harness)
		reason string
	}{
		{name: "a tenant that is no subject token", reason: "bad.tenant"},
		{name: "an event the bus refuses as invalid", reason: "refused", setup: func(h *harness) {
			h.bus.Refuse(func(_ string, ev proto.Message) error {
				if m, ok := ev.(*shizuv1.RentalMigrating); ok && m.GetRentalId() == "r-bad" {
					return fault.Invalid("refused")
				}
				return nil
			})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, harnessConfig())
			bad := h.rent(t, "r-bad", shizuv1.Plan_PLAN_RESERVED) // first in storm order
			if c.reason == "bad.tenant" {
				bad.Tenant = "bad.tenant"
			}
			if c.setup != nil {
				c.setup(h)
			}
			allocs := []migrate.Allocation{bad, h.rent(t, "r1", shizuv1.Plan_PLAN_ON_DEMAND), h.rent(t, "r2", shizuv1.Plan_PLAN_ON_DEMAND)}
			if err := h.f.queueMoves(t.Context(), allocs, lossOf("n1")); err != nil {
				t.Fatal(err)
			}
			if err := h.round(t); err != nil {
				t.Fatalf("the batch failed: %v", err)
			}
			if got := migratingRentals(h); !slices.Equal(got, []string{"r1", "r2"}) {
				t.Fatalf("handed over %v, want r1 and r2", got)
			}
			if m, _ := h.record(t, "r-bad"); m.Published || !strings.Contains(m.Failed, c.reason) {
				t.Fatalf("r-bad's record %+v, want unpublished and failed for %q", m, c.reason)
			}
			for _, r := range []string{"r1", "r2"} {
				if m, _ := h.record(t, r); !m.Published || m.Failed != "" {
					t.Fatalf("%s's record %+v, want published", r, m)
				}
			}
			if c.reason == "bad.tenant" && !slices.Equal(h.capacity.Held("n1"), []string{"r-bad"}) {
				t.Fatalf("n1 holds %v, want only r-bad (set aside before anything was released)", h.capacity.Held("n1"))
			}
		})
	}
}

func TestABusFailureLeavesTheMovesForTheSweepButNotTheFailedOnes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	bad := h.rent(t, "r-bad", shizuv1.Plan_PLAN_RESERVED)
	bad.Tenant = "bad.tenant"
	if err := h.f.queueMoves(t.Context(), []migrate.Allocation{bad, h.rent(t, "r1", shizuv1.Plan_PLAN_ON_DEMAND)}, lossOf("n1")); err != nil {
		t.Fatal(err)
	}
	down := fault.Unavailable("nats down")
	h.bus.FailOn("Wait", down)
	if err := h.round(t); err == nil {
		t.Fatal("a bus failure was not returned")
	}
	if m, _ := h.record(t, "r1"); m.Published {
		t.Fatal("r1 is marked handed over without its ack")
	}
	if m, _ := h.record(t, "r-bad"); m.Failed == "" {
		t.Fatal("r-bad's failure was not recorded before the wait: the sweep would retry it")
	}
	h.now = t0.Add(time.Hour)
	stale, err := h.f.staleMoves(t.Context(), h.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].Rental != "r1" {
		t.Fatalf("the sweep requeues %v, want r1 only", stale)
	}
}

func TestARentalStoppedDuringItsMakeBeforeBreakMoveIsNotMoved(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	s1 := h.rent(t, "s1", shizuv1.Plan_PLAN_SPOT)
	notice := migrate.Order{Node: "n1", Epoch: 4, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION),
		Mode: migrate.ModeMakeBeforeBreak, Decided: t0, Cause: "node:n1:interruption:4"}
	if err := h.f.queueMoves(t.Context(), []migrate.Allocation{s1}, notice); err != nil {
		t.Fatal(err)
	}
	// The tenant cancels before the hand-over: the scheduler releases the
	// allocation.
	if _, err := h.capacity.ReleaseOn(t.Context(), "n1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := h.round(t); err != nil {
		t.Fatal(err)
	}
	if got := h.bus.Delivered(); len(got) != 0 {
		t.Fatalf("published %v for a rental that stopped", got)
	}
	if _, ok := h.record(t, "s1"); ok {
		t.Fatal("the move of a rental that stopped is still recorded")
	}
}

func TestAMakeBeforeBreakMoveHandsTheOldAllocationOverAndStopsNothingYet(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	s1 := h.rent(t, "s1", shizuv1.Plan_PLAN_SPOT)
	notice := migrate.Order{Node: "n1", Epoch: 4, Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION),
		Mode: migrate.ModeMakeBeforeBreak, Decided: t0, Cause: "node:n1:interruption:4"}
	if err := h.f.queueMoves(t.Context(), []migrate.Allocation{s1}, notice); err != nil {
		t.Fatal(err)
	}
	if err := h.round(t); err != nil {
		t.Fatal(err)
	}
	if got := migratingRentals(h); !slices.Equal(got, []string{"s1"}) || len(delivered[*shizuv1.StopRental](h)) != 0 {
		t.Fatalf("delivered %v", h.bus.Delivered())
	}
	if !slices.Equal(h.capacity.Held("n1"), []string{"s1"}) || len(h.capacity.Released) != 0 {
		t.Fatalf("n1 holds %v after releases %v, want s1's allocation kept (handed over)", h.capacity.Held("n1"), h.capacity.Released)
	}
	// The replacement starts: the old run is told to stop, at no downtime.
	started := &shizuv1.RentalStarted{Meta: shizuv1.NewMeta("rental:s1:started:2", "agent", "", "s1", t0), RentalId: "s1", TenantId: "acme",
		NodeId: "n2", NodeEpoch: 1, StartedAt: timestamppb.New(t0.Add(time.Second)), Attempt: 2}
	if err := h.f.onStarted(t.Context(), started, bus.Delivery{MsgID: "rental:s1:started:2"}); err != nil {
		t.Fatal(err)
	}
	stops := delivered[*shizuv1.StopRental](h)
	done := delivered[*shizuv1.RentalMigrated](h)
	if len(stops) != 1 || stops[0].GetAttempt() != 1 || stops[0].GetReason() != shizuv1.ExitReason_EXIT_REASON_MIGRATED {
		t.Fatalf("stops %v", stops)
	}
	if len(done) != 1 || done[0].GetDowntime().AsDuration() != 0 || done[0].GetCheckpointUri() != "s3://ckpt/s1" {
		t.Fatalf("migrated %v", done)
	}
}

func TestStartsCompleteOnlyTheNextAttemptsMove(t *testing.T) {
	t.Parallel()
	start := func(attempt int32) *shizuv1.RentalStarted {
		return &shizuv1.RentalStarted{Meta: shizuv1.NewMeta(fmt.Sprintf("rental:r1:started:%d", attempt), "agent", "", "r1", t0),
			RentalId: "r1", TenantId: "acme", NodeId: "n2", NodeEpoch: 1, StartedAt: timestamppb.New(t0), Attempt: attempt}
	}
	cases := []struct {
		name      string
		record    func(*migrate.Record)
		attempt   int32
		completes bool
	}{
		{name: "the next attempt's start completes a move not yet marked handed over", attempt: 2, completes: true},
		{name: "a later attempt's start completes it too", attempt: 3, completes: true},
		{name: "the old run's start is no completion", attempt: 1},
		{name: "an attempt-less move waits for no start", attempt: 2, record: func(r *migrate.Record) { r.FromAttempt, r.NextAttempt = 0, 0 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, harnessConfig())
			rec := failovertest.Record("r1")
			if c.record != nil {
				c.record(&rec)
			}
			if err := h.moves.Put(t.Context(), rec); err != nil {
				t.Fatal(err)
			}
			if err := h.f.onStarted(t.Context(), start(c.attempt), bus.Delivery{MsgID: "started"}); err != nil {
				t.Fatal(err)
			}
			done := delivered[*shizuv1.RentalMigrated](h)
			_, recorded := h.record(t, "r1")
			if c.completes != (len(done) == 1) || c.completes == recorded {
				t.Fatalf("%d RentalMigrated, record kept %v; want completed %v", len(done), recorded, c.completes)
			}
			if c.completes && (done[0].GetDowntime().AsDuration() != 3*time.Second || done[0].GetMeta().GetCausationId() != "started") {
				t.Fatalf("migrated %v, want 3 s down since the last beat, caused by the start", done[0])
			}
		})
	}
}

func TestTheSweepMovesTheOrphansOfADeadNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	for _, r := range []string{"covered", "unrecorded", "moved-here"} {
		h.rent(t, r, shizuv1.Plan_PLAN_ON_DEMAND)
	}
	movedHere := failovertest.Record("moved-here")
	movedHere.FromNode = "n0"
	if err := h.moves.PutMany(t.Context(), []migrate.Record{failovertest.Record("covered"), movedHere}); err != nil {
		t.Fatal(err)
	}
	allocation := func(rental string) capacity.Allocation {
		return capacity.Allocation{Placement: capacity.Placement{RentalID: rental, NodeID: "n1", Tenant: "acme"}}
	}
	nodes := []capacity.NodeState{
		{Node: capacity.Node{ID: "n1"}, Epoch: 5, Status: capacity.StatusDead,
			Allocations: []capacity.Allocation{allocation("covered"), allocation("unrecorded"), allocation("moved-here")}},
		{Node: capacity.Node{ID: "n2"}, Epoch: 1, Status: capacity.StatusReady, Allocations: []capacity.Allocation{allocation("alive")}},
	}
	if err := h.f.moveOrphans(t.Context(), nodes, t0); err != nil {
		t.Fatal(err)
	}
	if err := h.round(t); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, ev := range delivered[*shizuv1.RentalMigrating](h) {
		got[ev.GetRentalId()] = fmt.Sprintf("%s@%d next %d", ev.GetMeta().GetCausationId(), ev.GetFromNodeEpoch(), ev.GetNextAttempt())
	}
	want := map[string]string{"unrecorded": "node:n1:lost:4@4 next 2", "moved-here": "node:n1:lost:4@4 next 3"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("moved %v, want %v", got, want)
	}
}

func TestMovesWaitForALossDueWithinATick(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	if err := h.f.queueMoves(t.Context(), []migrate.Allocation{h.rent(t, "r1", shizuv1.Plan_PLAN_ON_DEMAND)}, lossOf("n1")); err != nil {
		t.Fatal(err)
	}
	// n2's agent was killed with n1's: its disconnect is confirmed 300 ms on.
	h.f.det.Beat("n2", 1, t0.Add(-time.Second))
	h.f.det.Disconnected("n2", t0)
	if ms := h.f.due(t0.Add(100*time.Millisecond), true); len(ms) != 0 {
		t.Fatalf("handed over %d moves while a loss was due in 200 ms", len(ms))
	}
	if ms := h.f.due(t0.Add(299*time.Millisecond), false); len(ms) != 0 {
		t.Fatal("the hold ended early")
	}
	if ms := h.f.due(t0.Add(300*time.Millisecond), false); len(ms) != 1 {
		t.Fatalf("%d moves after the hold, want 1", len(ms))
	}
}

func TestTheNextAttemptsScheduleIsMeasuredOnceAndTheLatestPlacementKept(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessConfig())
	h.rent(t, "r1", shizuv1.Plan_PLAN_ON_DEMAND)
	if err := h.moves.Put(t.Context(), failovertest.Record("r1")); err != nil {
		t.Fatal(err)
	}
	scheduled := func(attempt int32, node string) *shizuv1.RentalScheduled {
		return &shizuv1.RentalScheduled{Meta: shizuv1.NewMeta(fmt.Sprintf("rental:r1:scheduled:%d", attempt), "scheduler", "", "r1", t0),
			RentalId: "r1", TenantId: "acme", NodeId: node, Attempt: attempt, Spec: &shizuv1.RentalSpec{Plan: shizuv1.Plan_PLAN_ON_DEMAND}}
	}
	for _, ev := range []*shizuv1.RentalScheduled{scheduled(2, "n2"), scheduled(1, "n1"), scheduled(2, "n2")} {
		if err := h.f.onScheduled(t.Context(), ev, bus.Delivery{}); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := h.record(t, "r1"); !m.Scheduled {
		t.Fatalf("the move %+v is not marked scheduled", m)
	}
	puts := 0
	for _, c := range h.moves.Calls.Calls() {
		if c == "Put" {
			puts++
		}
	}
	if puts != 2 { // the fixture's, and the first schedule of attempt 2
		t.Fatalf("%d writes of the move, want it marked once", puts-1)
	}
	if p, _, err := h.placements.Get(t.Context(), "r1"); err != nil || p.Attempt != 2 || p.Node != "n2" {
		t.Fatalf("placement %+v (%v), want attempt 2 on n2 (a redelivered attempt 1 does not win)", p, err)
	}
}
