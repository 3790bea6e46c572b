package app_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// Lifecycle events metering cannot bill as they are, through the real
// service on real NATS and Redis: a stop stamped before its start (a
// clock step on the node) and a start or stop of a placement whose
// RentalScheduled never came.

// movableClock is a meter clock the test moves.
type movableClock struct{ ns atomic.Int64 }

func clockAt(t time.Time) *movableClock {
	c := &movableClock{}
	c.set(t)
	return c
}

func (c *movableClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func (c *movableClock) now() time.Time  { return time.Unix(0, c.ns.Load()).UTC() }
func (e *env) deadLetterReasons(t *testing.T) string {
	t.Helper()
	var reasons []string
	for _, dl := range deadLetters(t, e) {
		reasons = append(reasons, dl.Header.Get(bus.HeaderDLQReason))
	}
	return strings.Join(reasons, "\n")
}

// waitSegment waits until the store's state of ref satisfies ok.
func waitSegment(t *testing.T, store *redisstore.Store, ref ledger.SegmentRef, what string, ok func(ledger.SegmentState) bool) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, func() error {
		st, err := segment(t.Context(), store, ref)
		if err != nil {
			return err
		}
		if !ok(st) {
			return fmt.Errorf("segment %+v: not %s yet", st, what)
		}
		return nil
	})
}

// A RentalStopped whose stopped_at is before its started_at (the agent's
// wall clock stepped back during the run) ends the run at the last time
// metering trusts: what it already billed. Nothing billed is lost or
// published twice, the run bills nothing more however long the clock
// runs, and the stop is kept in the dead letters with the reason.
func TestAStopStampedBeforeItsStartEndsTheRunAtWhatWasBilledAndIsFlagged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	clock := clockAt(base)
	r := e.startMeter(t, cfg, clock.now)
	run := rental{id: "stepped", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: base.Add(15 * time.Second)}}}
	e.publish(t, run.events())
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	ref := ledger.SegmentRef{RentalID: "stepped", Attempt: 1}
	waitSegment(t, store, ref, "scheduled and started", func(st ledger.SegmentState) bool { return st.Scheduled && !st.StartedAt.IsZero() })
	// Three minutes billed while it ran.
	clock.set(base.Add(3*time.Minute + cfg.CloseGrace))
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("H100-SXM5-80GB")
	sg, _ := run.state(cat, 0).Segment()
	recs, _, _ := ledger.Close(sg, ledger.Tariff{Base: list}, cfg.Rules, time.Time{}, base.Add(3*time.Minute))
	want := map[string]int64{}
	for _, rec := range recs {
		want[rec.ID] = rec.Amount.Micros
	}
	e.settled(t, cfg.KeyPrefix, want)

	stoppedSubj, _ := subject.Format(subject.RentalStopped, "t0")
	e.publish(t, []event{{stoppedSubj, &shizuv1.RentalStopped{
		Meta:     meta("rental:stepped:stopped:1", base.Add(5*time.Second)),
		RentalId: "stepped", TenantId: "t0", NodeId: "node-1", NodeEpoch: 1, Attempt: 1,
		StartedAt: timestamppb.New(base.Add(15 * time.Second)), StoppedAt: timestamppb.New(base.Add(5 * time.Second)),
		ExitReason: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}})
	testkit.Eventually(t, 15*time.Second, func() error {
		if all := e.deadLetterReasons(t); !strings.Contains(all, "the run is ended") {
			return fmt.Errorf("no dead letter says the run is ended; have:\n%s", all)
		}
		return nil
	})
	// An hour later the run has billed nothing more.
	clock.set(base.Add(time.Hour))
	for range 2 {
		if _, err := r.meter.CloseDue(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	e.settled(t, cfg.KeyPrefix, want)
	st, err := segment(t.Context(), store, ref)
	if err != nil || !st.Done || !st.Cursor.Equal(base.Add(3*time.Minute)) {
		t.Fatalf("segment %+v (%v): want it finished at what was billed (3 min)", st, err)
	}
	if _, err := e.rdb.ZScore(t.Context(), cfg.KeyPrefix+"due", "stepped 1").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the stepped run is still on the due list (%v)", err)
	}
}

// counterSum is the sum of a counter's data points in rm (0 when absent).
func counterSum(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range s.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// A start, or a start and its stop, of a placement whose RentalScheduled
// metering never saw cannot be billed: metering counts them, and once the
// park grace has passed (by the watermark and the clock) dead-letters each
// with the reason, as the metering user, and drops what it parked.
func TestLifecycleEventsWithoutTheirScheduleAreDeadLetteredAfterTheGrace(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t) // the dead letters are published as the metering user
	reader := sdkmetric.NewManualReader()
	e.metrics = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := testConfig()
	clock := clockAt(base)
	r := e.startMeter(t, cfg, clock.now)
	started := rental{id: "no-schedule", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: base.Add(15 * time.Second)}}}
	ended := started
	ended.id, ended.segs = "no-schedule-ended", []seg{{node: "node-2", start: base, stop: base.Add(time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}
	e.publish(t, append(started.events()[1:], ended.events()[1:]...)) // without the RentalScheduled
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	for _, id := range []string{started.id, ended.id} {
		waitSegment(t, store, ledger.SegmentRef{RentalID: id, Attempt: 1}, "started", func(st ledger.SegmentState) bool { return !st.StartedAt.IsZero() })
	}
	testkit.Eventually(t, 15*time.Second, func() error { return e.busy(t.Context()) })
	clock.set(base.Add(2 * time.Hour))
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		all := e.deadLetterReasons(t)
		for _, id := range []string{started.id, ended.id} {
			if !strings.Contains(all, "rental "+id+" attempt 1") || !strings.Contains(all, "no RentalScheduled") {
				return fmt.Errorf("no dead letter names %s and the missing RentalScheduled; have:\n%s", id, all)
			}
		}
		return nil
	})
	for _, id := range []string{started.id, ended.id} {
		if n, err := e.rdb.Exists(t.Context(), cfg.KeyPrefix+"seg:"+id+":1").Result(); err != nil || n != 0 {
			t.Fatalf("the parked segment of %s is still in Redis (%d, %v)", id, n, err)
		}
	}
	if refs, err := store.Due(t.Context(), base.Add(24*time.Hour), 100); err != nil || len(refs) != 0 {
		t.Fatalf("due %v (%v), want nothing parked left", refs, err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	if parked, gaveUp := counterSum(rm, "shizu.metering.events_parked"), counterSum(rm, "shizu.metering.parked_given_up"); parked < 2 || gaveUp != 2 {
		t.Fatalf("events_parked %d, parked_given_up %d: want at least 2 and 2", parked, gaveUp)
	}
}

// A RentalScheduled that comes within the park grace, after its start and
// stop, is billed as if it had come first, and nothing is dead-lettered.
func TestAScheduleArrivingWithinTheParkGraceIsBilledNormally(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	clock := clockAt(base)
	r := e.startMeter(t, cfg, clock.now)
	late := rental{id: "late-schedule", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 2, milli: 1000,
		segs: []seg{{node: "node-1", start: base, stop: base.Add(90 * time.Second), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
	evs := late.events()
	e.publish(t, evs[1:])
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	ref := ledger.SegmentRef{RentalID: late.id, Attempt: 1}
	waitSegment(t, store, ref, "stopped", func(st ledger.SegmentState) bool { return !st.StoppedAt.IsZero() && !st.StartedAt.IsZero() })
	testkit.Eventually(t, 15*time.Second, func() error { return e.busy(t.Context()) })
	clock.set(base.Add(90*time.Second + 5*time.Minute)) // inside the default grace
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.publish(t, evs[:1])
	want := expectedLedger(t, cfg, []rental{late})
	e.settled(t, cfg.KeyPrefix, want)
	clock.set(base.Add(2 * time.Hour))
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.settled(t, cfg.KeyPrefix, want)
	if dls := deadLetters(t, e); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none: %s", len(dls), e.deadLetterReasons(t))
	}
	if st, err := segment(t.Context(), store, ref); err != nil || !st.Done {
		t.Fatalf("segment %+v (%v), want it billed and finished", st, err)
	}
}
