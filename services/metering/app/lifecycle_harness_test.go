package app_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// syncBuffer is a log sink the meter and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loggedHarness is newHarness with the meter's logs in a buffer.
func loggedHarness(t *testing.T) (*harness, *syncBuffer) {
	t.Helper()
	h := newHarness(t, "")
	logs := &syncBuffer{}
	m, err := app.NewMeter(h.cfg, app.Deps{Store: h.store, Publisher: h.pub, Now: func() time.Time { return h.now },
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	h.meter = m
	return h, logs
}

func TestHarnessAStartWithoutItsScheduleIsLoggedThenDeadLetteredAfterTheParkGrace(t *testing.T) {
	t.Parallel()
	h, logs := loggedHarness(t)
	r := stoppedRental("orphan", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, time.Minute)
	r.segs[0].stop = time.Time{}
	h.rentals(t, r.events()[1:]) // the start alone
	if !strings.Contains(logs.String(), "parked until its RentalScheduled arrives") || !strings.Contains(logs.String(), "rental=orphan") {
		t.Fatalf("no log line names the parked rental:\n%s", logs)
	}
	h.now = base.Add(h.cfg.ParkGrace - time.Second)
	if _, err := h.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if dls := h.pub.DeadLetters(); len(dls) != 0 {
		t.Fatalf("dead-lettered within the grace: %+v", dls)
	}
	h.now = base.Add(h.cfg.ParkGrace + h.cfg.CloseGrace + time.Minute)
	for range 2 { // the second look finds nothing left
		if _, err := h.meter.CloseDue(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	dls := h.pub.DeadLetters()
	if len(dls) != 1 || dls[0].Subject != "dlq.RENTALS.metering" || !strings.Contains(dls[0].Reason, "rental orphan attempt 1: started at") {
		t.Fatalf("dead letters %+v: want one for the orphan start on dlq.RENTALS.metering", dls)
	}
	if ev, ok := dls[0].Event.(*shizuv1.RentalStarted); !ok || ev.GetRentalId() != "orphan" || !ev.GetStartedAt().AsTime().Equal(base) {
		t.Fatalf("dead letter event %v: want the start", dls[0].Event)
	}
	st, due := h.store.Segment(ledger.SegmentRef{RentalID: "orphan", Attempt: 1})
	if !st.StartedAt.IsZero() || due.Listed || len(h.usage()) != 0 {
		t.Fatalf("segment %+v %+v, %d records: want it dropped and nothing billed", st, due, len(h.usage()))
	}
	if !strings.Contains(logs.String(), "given up") {
		t.Fatalf("no log line says the orphan was given up:\n%s", logs)
	}
}

func TestHarnessAStopBeforeItsStartIsDeadLetteredButEndsTheRunWithTheMinimumCharge(t *testing.T) {
	t.Parallel()
	h, logs := loggedHarness(t)
	r := stoppedRental("stepped", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 20*time.Second)
	evs := r.events()
	evs[2].msg.(*shizuv1.RentalStopped).StoppedAt = timestamppb.New(base.Add(-time.Hour))
	errs := h.meter.HandleRentals(t.Context(), deliveries(t, evs))
	if errs[0] != nil || errs[1] != nil || !fault.IsInvalid(errs[2]) || !strings.Contains(errs[2].Error(), "the run is ended") {
		t.Fatalf("outcomes %v: want the stop alone dead-lettered, saying the run is ended", errs)
	}
	// Nothing was billed before the stop, and the tenant ended the run: it
	// owes the minimum charge whatever it really ran.
	h.assertBilled(t, "stepped", 1, []billed{{base, 60, 2_490_000}})
	if st, due := h.store.Segment(ledger.SegmentRef{RentalID: "stepped", Attempt: 1}); !st.Done || due.Listed {
		t.Fatalf("segment %+v %+v: want it finished", st, due)
	}
	if !strings.Contains(logs.String(), "stop stamped before its start") || !strings.Contains(logs.String(), "rental=stepped") {
		t.Fatalf("no log line names the stepped stop:\n%s", logs)
	}
}

// A spot rental whose price rose above its maximum is not billed for those
// seconds (unchanged), but an operator sees them: counted and logged.
func TestHarnessSpotSecondsAboveTheMaximumAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	logs := &syncBuffer{}
	reader := sdkmetric.NewManualReader()
	m, err := app.NewMeter(h.cfg, app.Deps{Store: h.store, Publisher: h.pub, Now: func() time.Time { return h.now },
		Log: slog.New(slog.NewTextHandler(logs, nil)), Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	h.meter = m
	h.spot(t, []ledger.PricePoint{
		{At: base.Add(-time.Hour), Price: pricing.Money{Micros: 900_000, Currency: "USD"}},
		{At: base.Add(30*time.Second + 250*time.Millisecond), Price: pricing.Money{Micros: 1_400_000, Currency: "USD"}},
		{At: base.Add(100 * time.Second), Price: pricing.Money{Micros: 700_000, Currency: "USD"}},
	}...)
	r := stoppedRental("capped", shizuv1.Plan_PLAN_SPOT, 1, base, 150*time.Second)
	r.maxSpot = &pricing.Money{Micros: 1_000_000, Currency: "USD"}
	h.rentals(t, r.events())
	h.assertBilled(t, "capped", 1, []billed{{base, 31, 900_000}, {base.Add(100 * time.Second), 20, 700_000}, {base.Add(2 * time.Minute), 30, 700_000}})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	if n := counterSum(rm, "shizu.metering.spot_seconds_above_max"); n != 69 {
		t.Fatalf("spot_seconds_above_max %d, want the 69 seconds priced at 1.40 over the 1.00 maximum", n)
	}
	if !strings.Contains(logs.String(), "above the tenant's maximum") || !strings.Contains(logs.String(), "rental=capped") {
		t.Fatalf("no log line names the rental:\n%s", logs)
	}
}

// A node whose wall clock runs an hour behind the scheduler's stamps its
// run an hour before it was placed. Billed at face value, the running
// rental's first close would bill that whole hour at once (and its stop,
// 90 s after the stamped start, could not take it back). It is billed from
// its placement, for as long as its stamps say it ran, and nothing before.
func TestHarnessARunStampedBeforeItsPlacementIsBilledFromThePlacementForItsLength(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	placed := base.Add(time.Hour)
	r := stoppedRental("behind", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 90*time.Second)
	evs := r.events()
	evs[0].msg.(*shizuv1.RentalScheduled).Meta.OccurredAt = timestamppb.New(placed)
	h.now = placed.Add(time.Minute + h.cfg.CloseGrace) // running: the first minute after the placement closes
	h.rentals(t, evs[:2])
	if _, err := h.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.assertBilled(t, "behind", 1, []billed{{placed, 60, 2_490_000}})
	h.rentals(t, evs[2:])
	if _, err := h.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.assertBilled(t, "behind", 1, []billed{{placed, 60, 2_490_000}, {placed.Add(time.Minute), 30, 2_490_000}})
}
