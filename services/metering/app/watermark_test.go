package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// backlogRentals are on-demand rentals that ran for minutes and all ended
// at end: stopped, or, for one, lost with its node (its last heartbeat at
// end, reported by failover). It returns them and their events in two
// parts: the scheduled and started events, then the ends.
func backlogRentals(n int, end time.Time) ([]rental, []event, []event) {
	var rentals []rental
	for i := range n {
		start := end.Add(-3*time.Minute - time.Duration(i)*7*time.Second)
		rentals = append(rentals, rental{id: fmt.Sprintf("bl-%03d", i), tenant: fmt.Sprintf("t%d", i%3), model: "H100-SXM5-80GB",
			zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1 + int32(i%4), milli: 1000,
			segs: []seg{{node: "node-1", start: start, stop: end, exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}})
	}
	rentals = append(rentals, rental{id: "bl-lost", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1",
		plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 2, milli: 1000, segs: []seg{{node: "node-2", start: end.Add(-6 * time.Minute), lost: end}}})
	var starts, ends []event
	for _, r := range rentals {
		for _, ev := range r.events() {
			switch ev.msg.(type) {
			case *shizuv1.RentalStopped, *shizuv1.RentalMigrating:
				ends = append(ends, ev)
			default:
				starts = append(starts, ev)
			}
		}
	}
	return rentals, starts, ends
}

// The node-agents publish every start and then every stop (and failover a
// lost node), stamped when they happened, while metering is down. Metering comes
// back hours later (its clock says so) and meets the whole backlog: its
// closer must not bill any running rental past the stop that is already on
// the bus behind its start, and a replica killed in the middle of the
// backlog and replaced must change nothing. The rental events are handled
// one at a time, so every start is handled long before its stop.
func TestTheCloserNeverBillsPastAStopStillInTheBacklog(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t) // metering reads its watermark as its own user
	cfg := testConfig()
	cfg.Batch, cfg.Concurrency = 1, 1
	// Stamped before the publish, as an agent stamps a stop (and failover
	// reads a last heartbeat) before it publishes.
	rentals, starts, ends := backlogRentals(40, time.Now().UTC())
	want := expectedLedger(t, cfg, rentals)
	e.publish(t, starts)
	e.publish(t, ends)

	late := func() time.Time { return time.Now().Add(2 * time.Hour) }
	a := e.startMeterTicking(t, cfg, late, 10*time.Millisecond)
	testkit.Eventually(t, 20*time.Second, func() error { // mid-backlog: some handled, the stops not all
		info, err := e.consumerInfo(t.Context(), topology.StreamRentals, "metering")
		if err != nil {
			return err
		}
		if info.AckFloor.Consumer < uint64(len(starts))/2 {
			return fmt.Errorf("%d of %d rental events handled", info.AckFloor.Consumer, len(starts)+len(ends))
		}
		return nil
	})
	a.kill()
	b := e.startMeterTicking(t, cfg, late, 10*time.Millisecond)
	e.settled(t, cfg.KeyPrefix, want)

	// Everything is handled: the closer may now bill up to its clock, and
	// finds nothing more to bill.
	for range 3 {
		if _, err := b.meter.CloseDue(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	got, msgs := e.billed(t)
	if msgs != len(want) || strings.Join(sortedIDs(got), ",") != strings.Join(sortedIDs(want), ",") || total(got) != total(want) {
		t.Fatalf("ledger differs from the clean run: %d records in %d messages / %d µ, want %d / %d µ",
			len(got), msgs, total(got), len(want), total(want))
	}
	for id, amount := range want {
		if got[id] != amount {
			t.Fatalf("record %s billed %d µ, want %d", id, got[id], amount)
		}
	}
}

// A rental still running once the backlog is handled is billed by the
// closer up to the clock again: the watermark holds billing back only while
// events stored earlier are unhandled.
func TestARentalStillRunningIsBilledOnceTheBacklogIsHandled(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t) // metering reads its watermark as its own user
	cfg := testConfig()
	start := time.Now().UTC().Add(-5 * time.Minute)
	running := rental{id: "still", tenant: "t1", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND,
		gpus: 1, milli: 1000, segs: []seg{{node: "node-1", start: start}}}
	e.publish(t, running.events())
	r := e.startMeter(t, cfg, time.Now)
	testkit.Eventually(t, 20*time.Second, func() error {
		info, err := e.consumerInfo(t.Context(), topology.StreamRentals, "metering")
		if err != nil {
			return err
		}
		if info.NumPending+uint64(info.NumAckPending) > 0 {
			return fmt.Errorf("%d rental events to handle", info.NumPending+uint64(info.NumAckPending))
		}
		return nil
	})
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	// At least four: the intervals that ended more than the grace (30 s)
	// before now, of a rental that started 5 min ago.
	if got, _ := e.billed(t); len(got) < 4 {
		t.Fatalf("%d records of the running rental, want at least 4", len(got))
	}
}

// The watermark's lag is exported, so operators see a metering backlog:
// with the meter's clock two hours ahead of the server's, the lag it
// records once it has handled everything is those two hours.
func TestTheWatermarkLagIsExported(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	reader := sdkmetric.NewManualReader()
	e.metrics = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	cfg := testConfig()
	running := rental{id: "lagging", tenant: "t1", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND,
		gpus: 1, milli: 1000, segs: []seg{{node: "node-1", start: time.Now().UTC().Add(-time.Minute)}}}
	e.publish(t, running.events())
	ahead := 2 * time.Hour
	r := e.startMeter(t, cfg, func() time.Time { return time.Now().Add(ahead) })
	testkit.Eventually(t, 20*time.Second, func() error {
		info, err := e.consumerInfo(t.Context(), topology.StreamRentals, "metering")
		if err != nil {
			return err
		}
		if n := info.NumPending + uint64(info.NumAckPending); n > 0 {
			return fmt.Errorf("%d rental events to handle", n)
		}
		return nil
	})
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "shizu.metering.watermark_lag" {
				continue
			}
			g, ok := m.Data.(metricdata.Gauge[float64])
			if !ok || len(g.DataPoints) != 1 {
				t.Fatalf("watermark lag is %T with %+v", m.Data, m.Data)
			}
			// The clock is two hours ahead; the server's time is read in
			// the same second or so.
			if lag := time.Duration(g.DataPoints[0].Value * float64(time.Second)); lag < ahead-time.Minute || lag > ahead+time.Minute {
				t.Fatalf("watermark lag %v, want about %v", lag, ahead)
			}
			return
		}
	}
	t.Fatal("no shizu.metering.watermark_lag recorded")
}
