package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app/metertest"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// Events published on tenant t0's subjects whose bodies name another
// tenant are never billed: the forged rental's schedule, start and stop
// (tenant "victim") and a usage record naming t1 are dead-lettered with a
// reason naming both tenants, and the ledger and the aggregates hold t0's
// honest rental only.
func TestEventsWhoseBodyNamesAnotherTenantAreNeverBilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	clock := clockAt(base)
	r := e.startMeter(t, cfg, clock.now)
	run := []seg{{node: "node-1", start: base, stop: base.Add(90 * time.Second), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}
	honest := rental{id: "honest", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000, segs: run}
	forged := honest
	forged.id, forged.tenant = "forged", "victim"
	evs := forged.events()
	for i := range evs {
		evs[i].subject = strings.Replace(evs[i].subject, ".victim.", ".t0.", 1)
	}
	evs = append(evs, event{"usage.t0.recorded", metertest.UsageRecord("usage:forged:t1", "t1", 5_000_000)})
	e.publish(t, append(evs, honest.events()...))

	testkit.Eventually(t, 30*time.Second, func() error {
		if n := strings.Count(e.deadLetterReasons(t), `names tenant "t0"`); n != len(evs) {
			return fmt.Errorf("%d of %d forged events dead-lettered: %s", n, len(evs), e.deadLetterReasons(t))
		}
		return nil
	})
	for _, want := range []string{`body names tenant "victim"`, `body names tenant "t1"`} {
		if !strings.Contains(e.deadLetterReasons(t), want) {
			t.Errorf("no dead letter says %s: %s", want, e.deadLetterReasons(t))
		}
	}
	// The honest rental's stop is merged before the clock moves past it.
	waitSegment(t, redisstore.New(e.rdb, cfg.KeyPrefix), ledger.SegmentRef{RentalID: honest.id, Attempt: 1}, "stopped",
		func(st ledger.SegmentState) bool { return !st.StoppedAt.IsZero() && !st.StartedAt.IsZero() })
	testkit.Eventually(t, 15*time.Second, func() error { return e.busy(t.Context()) })
	clock.set(base.Add(2 * time.Hour))
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := expectedLedger(t, cfg, []rental{honest})
	store := aggregatesOf(e.rdb, cfg.KeyPrefix)
	testkit.Eventually(t, 30*time.Second, func() error {
		got, _ := e.billed(t)
		delete(got, "usage:forged:t1") // published by the test, never aggregated
		if len(got) != len(want) || total(got) != total(want) {
			return fmt.Errorf("metering recorded %v, want %v", got, want)
		}
		if err := e.busy(t.Context()); err != nil {
			return err
		}
		for tenant, micros := range map[string]int64{"t0": total(want), "t1": 0, "victim": 0} {
			v, err := store.TenantTotal(t.Context(), tenant, "USD")
			if err != nil {
				return err
			}
			if v != micros {
				return fmt.Errorf("tenant %s billed %d µ, want %d", tenant, v, micros)
			}
		}
		return nil
	})
	if micros, _, err := store.Rental(t.Context(), "forged"); err != nil || micros != 0 {
		t.Fatalf("the forged rental billed %d µ (%v)", micros, err)
	}
}
