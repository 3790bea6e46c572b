package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/app/metertest"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// The plan harness: a Meter on the recording fakes with a fixed clock,
// driven with plain values (events as deliveries, CloseDue), asserting on
// what it publishes and commits. No NATS, no Redis.

type harness struct {
	meter *app.Meter
	store *metertest.Store
	pub   *metertest.Publisher
	now   time.Time
	cfg   app.Config
}

// newHarness runs a meter at base on the fakes; accounts, when not empty,
// is the accounts file's JSON.
func newHarness(t *testing.T, accounts string) *harness {
	t.Helper()
	h := &harness{store: metertest.NewStore(), pub: metertest.NewPublisher(), now: base, cfg: testConfig()}
	if accounts != "" {
		path := filepath.Join(t.TempDir(), "accounts.json")
		if err := os.WriteFile(path, []byte(accounts), 0o600); err != nil {
			t.Fatal(err)
		}
		h.cfg.AccountsPath = path
	}
	m, err := app.NewMeter(h.cfg, app.Deps{Store: h.store, Publisher: h.pub, Now: func() time.Time { return h.now }})
	if err != nil {
		t.Fatal(err)
	}
	h.meter = m
	return h
}

func deliveries(t *testing.T, evs []event) []bus.Delivery {
	t.Helper()
	ds := make([]bus.Delivery, len(evs))
	for i, ev := range evs {
		data, err := proto.Marshal(ev.msg)
		if err != nil {
			t.Fatal(err)
		}
		ds[i] = bus.Delivery{Subject: ev.subject, Event: bus.EventName(ev.msg), MsgID: bus.EventID(ev.msg), Data: data, Delivered: 1}
	}
	return ds
}

// rentals hands evs to the RENTALS handler as one batch; every delivery
// must succeed.
func (h *harness) rentals(t *testing.T, evs []event) {
	t.Helper()
	if err := errors.Join(h.meter.HandleRentals(t.Context(), deliveries(t, evs))...); err != nil {
		t.Fatalf("rental batch: %v", err)
	}
}

func (h *harness) spot(t *testing.T, points ...ledger.PricePoint) {
	t.Helper()
	for _, ev := range spotEventsOf("eu-1", points) {
		if err := h.meter.HandleSpotPrice(t.Context(), ev.msg.(*shizuv1.SpotPriceChanged), bus.Delivery{}); err != nil {
			t.Fatal(err)
		}
	}
}

func spotEventsOf(zone string, points []ledger.PricePoint) []event {
	var out []event
	for _, p := range points {
		out = append(out, event{"market.spot", &shizuv1.SpotPriceChanged{
			Meta:  meta("spot:"+zone+":"+p.At.Format(time.RFC3339), p.At),
			Model: "H100-SXM5-80GB", Zone: zone, PricePerGpuHour: p.Price.Proto(), EffectiveAt: timestamppb.New(p.At)}})
	}
	return out
}

// usage is every usage record published so far, by id.
func (h *harness) usage() map[string]*shizuv1.UsageRecorded {
	out := map[string]*shizuv1.UsageRecorded{}
	for _, m := range h.pub.Stored() {
		if r, ok := m.Event.(*shizuv1.UsageRecorded); ok {
			out[r.GetMeta().GetEventId()] = r
		}
	}
	return out
}

func (h *harness) crossings() []*shizuv1.BudgetThresholdCrossed {
	var out []*shizuv1.BudgetThresholdCrossed
	for _, m := range h.pub.Stored() {
		if c, ok := m.Event.(*shizuv1.BudgetThresholdCrossed); ok {
			out = append(out, c)
		}
	}
	return out
}

// fold hands every usage record published so far to the BILLING handler.
func (h *harness) fold(t *testing.T) []error {
	t.Helper()
	var evs []event
	for _, m := range h.pub.Stored() {
		if _, ok := m.Event.(*shizuv1.UsageRecorded); ok {
			evs = append(evs, event{m.Subject, m.Event})
		}
	}
	return h.meter.HandleUsage(t.Context(), deliveries(t, evs))
}

func stoppedRental(id string, plan shizuv1.Plan, gpus int32, start time.Time, ran time.Duration) rental {
	return rental{id: id, tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: plan, gpus: gpus, milli: 1000,
		segs: []seg{{node: "node-1", start: start, stop: start.Add(ran), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
}

type billed struct {
	start   time.Time
	seconds int64
	price   int64 // unit price per GPU-hour
}

func (h *harness) assertBilled(t *testing.T, rentalID string, gpus int32, want []billed) {
	t.Helper()
	var got []billed
	for _, r := range h.usage() {
		if r.GetRentalId() == rentalID {
			got = append(got, billed{r.GetIntervalStart().AsTime(), r.GetSeconds(), r.GetUnitPricePerGpuHour().GetMicros()})
		}
	}
	slices.SortFunc(got, func(a, b billed) int { return a.start.Compare(b.start) })
	if !slices.Equal(got, want) {
		t.Fatalf("%s billed %v, want %v", rentalID, got, want)
	}
	var total, exact int64
	for _, r := range h.usage() {
		if r.GetRentalId() == rentalID {
			total += r.GetAmount().GetMicros()
		}
	}
	if len(want) > 0 && want[0].price == want[len(want)-1].price {
		var secs int64
		for _, b := range want {
			secs += b.seconds
		}
		if exact = ledger.AmountMicros(want[0].price, gpus, 1000, secs); total != exact {
			t.Fatalf("%s billed %d µ, want %d µ", rentalID, total, exact)
		}
	}
}

func TestHarnessEachPlanIsBilledPerSecondAtItsTariff(t *testing.T) {
	t.Parallel()
	accounts := `{"commitments":[{"tenant_id":"t0","model":"H100-SXM5-80GB","gpu_count":4,"term":"year","start":"2026-01-01T00:00:00Z","discount_percent":75}]}`
	at := base.Add(500 * time.Millisecond)
	cases := []struct {
		name string
		r    rental
		want []billed
	}{
		{"on demand is the list price, cut at minute boundaries, the last second rounded up",
			stoppedRental("od", shizuv1.Plan_PLAN_ON_DEMAND, 2, at, 89*time.Second+100*time.Millisecond),
			[]billed{{at, 60, 2_490_000}, {base.Add(time.Minute), 30, 2_490_000}}},
		{"a short on-demand run the tenant ended is topped up to the minimum charge",
			stoppedRental("short", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 12*time.Second),
			[]billed{{base, 12, 2_490_000}, {base.Add(12 * time.Second), 48, 2_490_000}}},
		{"reserved inside the commitment is its rate (75 % off the list)",
			stoppedRental("res", shizuv1.Plan_PLAN_RESERVED, 4, base, 90*time.Second),
			[]billed{{base, 60, 622_500}, {base.Add(time.Minute), 30, 622_500}}},
		{"reserved by another tenant, without a commitment, is the list price",
			func() rental {
				r := stoppedRental("res-other", shizuv1.Plan_PLAN_RESERVED, 1, base, 30*time.Second)
				r.tenant = "t1"
				return r
			}(),
			[]billed{{base, 30, 2_490_000}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, accounts)
			h.rentals(t, tc.r.events())
			h.assertBilled(t, tc.r.id, tc.r.gpus, tc.want)
			st, due := h.store.Segment(ledger.SegmentRef{RentalID: tc.r.id, Attempt: 1})
			if !st.Done || due.Listed {
				t.Fatalf("a stopped rental's segment is not finished and off the due list: %+v %+v", st, due)
			}
		})
	}
}

func TestHarnessSpotSecondsArePricedAtThePriceInForceAndNotAboveTheMaximum(t *testing.T) {
	t.Parallel()
	prices := []ledger.PricePoint{
		{At: base.Add(-time.Hour), Price: pricing.Money{Micros: 900_000, Currency: "USD"}},
		{At: base.Add(30*time.Second + 250*time.Millisecond), Price: pricing.Money{Micros: 1_400_000, Currency: "USD"}},
		{At: base.Add(100 * time.Second), Price: pricing.Money{Micros: 700_000, Currency: "USD"}},
	}
	spot := func(id string, max *pricing.Money) rental {
		r := stoppedRental(id, shizuv1.Plan_PLAN_SPOT, 1, base, 150*time.Second)
		r.maxSpot = max
		return r
	}
	cases := []struct {
		name string
		r    rental
		want []billed
	}{
		// A second is priced at its first instant: the change at 30.25 s
		// prices second 31 on; records are cut at changes and boundaries.
		{"without a maximum every second is billed at its price",
			spot("uncapped", nil),
			[]billed{{base, 31, 900_000}, {base.Add(30*time.Second + 250*time.Millisecond), 29, 1_400_000},
				{base.Add(time.Minute), 40, 1_400_000}, {base.Add(100 * time.Second), 20, 700_000}, {base.Add(2 * time.Minute), 30, 700_000}}},
		{"seconds above the tenant's maximum are not billed",
			spot("capped", &pricing.Money{Micros: 1_000_000, Currency: "USD"}),
			[]billed{{base, 31, 900_000}, {base.Add(100 * time.Second), 20, 700_000}, {base.Add(2 * time.Minute), 30, 700_000}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			h.spot(t, prices...)
			h.rentals(t, tc.r.events())
			h.assertBilled(t, tc.r.id, 1, tc.want)
		})
	}
}

func TestHarnessARunningRentalIsClosedAtEachBoundaryOnceTheGraceHasPassed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	r := rental{id: "run", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: base.Add(10 * time.Second)}}}
	h.rentals(t, r.events())
	if len(h.usage()) != 0 {
		t.Fatalf("a rental just started is billed: %v", h.usage())
	}
	ref := ledger.SegmentRef{RentalID: "run", Attempt: 1}
	if _, due := h.store.Segment(ref); !due.At.Equal(base.Add(time.Minute + h.cfg.CloseGrace)) {
		t.Fatalf("first close due at %s, want the first boundary plus the grace", due.At)
	}
	steps := []struct {
		now  time.Time
		want []billed
	}{
		{base.Add(time.Minute + h.cfg.CloseGrace - time.Second), nil}, // the grace not over
		{base.Add(time.Minute + h.cfg.CloseGrace), []billed{{base.Add(10 * time.Second), 50, 2_490_000}}},
		{base.Add(3*time.Minute + h.cfg.CloseGrace), []billed{{base.Add(10 * time.Second), 50, 2_490_000},
			{base.Add(time.Minute), 60, 2_490_000}, {base.Add(2 * time.Minute), 60, 2_490_000}}},
	}
	for _, s := range steps {
		h.now = s.now
		if _, err := h.meter.CloseDue(t.Context()); err != nil {
			t.Fatal(err)
		}
		h.assertBilled(t, "run", 1, s.want)
	}
	st, due := h.store.Segment(ref)
	if !st.Cursor.Equal(base.Add(3*time.Minute)) || !due.At.Equal(base.Add(4*time.Minute+h.cfg.CloseGrace)) || st.Done {
		t.Fatalf("cursor %s, next close %s, done %v: want the third boundary, the fourth plus grace, running", st.Cursor, due.At, st.Done)
	}
}

func TestHarnessARedeliveredStartOrStopBillsNothingTwice(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	r := stoppedRental("again", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 150*time.Second)
	evs := r.events()
	h.rentals(t, evs)
	first := h.usage()
	ref := ledger.SegmentRef{RentalID: "again", Attempt: 1}
	finished, _ := h.store.Segment(ref)
	// The whole batch again, the start alone, and the stop before the start.
	for _, batch := range [][]event{evs, evs[1:2], {evs[2], evs[1]}} {
		h.rentals(t, batch)
	}
	if got := h.usage(); len(got) != len(first) || len(first) != 3 {
		t.Fatalf("%d records after redelivery, %d before; want the same 3", len(got), len(first))
	}
	st, due := h.store.Segment(ref)
	if !st.Cursor.Equal(finished.Cursor) || !st.Done || due.Listed {
		t.Fatalf("redelivery moved the segment: %+v %+v", st, due)
	}
	// A later start report (another node) does not move the start.
	late := r
	late.segs = []seg{{node: "node-9", start: base.Add(time.Hour), stop: base.Add(time.Hour + time.Minute)}}
	h.rentals(t, late.events()[1:2])
	if st, _ := h.store.Segment(ref); !st.StartedAt.Equal(base) || st.StartNode != "node-1" {
		t.Fatalf("a second start report moved the start to %s on %s", st.StartedAt, st.StartNode)
	}
}

func TestHarnessAFailedPublishAdvancesNoCursorAndTheRedeliveryPublishesTheSameRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	r := stoppedRental("flaky", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 90*time.Second)
	h.pub.FailWait = errors.New("stream unavailable")
	errs := h.meter.HandleRentals(t.Context(), deliveries(t, r.events()))
	if errs[1] == nil || errs[2] == nil {
		t.Fatalf("the start and stop were acknowledged although their records were not stored: %v", errs)
	}
	if st, _ := h.store.Segment(ledger.SegmentRef{RentalID: "flaky", Attempt: 1}); !st.Cursor.IsZero() || len(h.store.Advances) != 0 {
		t.Fatalf("a cursor advanced past unstored records: %+v", st)
	}
	h.pub.FailWait = nil
	h.rentals(t, r.events())
	h.assertBilled(t, "flaky", 1, []billed{{base, 60, 2_490_000}, {base.Add(time.Minute), 30, 2_490_000}})
}

func (h *harness) crossed() []string {
	var got []string
	for _, c := range h.crossings() {
		got = append(got, fmt.Sprintf("%s %d%% spent %d", c.GetMeta().GetEventId(), c.GetThresholdPercent(), c.GetSpent().GetMicros()))
	}
	return got
}

func TestHarnessBudgetAlertsAreDueOnceAndNotRepeated(t *testing.T) {
	t.Parallel()
	// Ten minutes of one GPU at 2.49 an hour is 415,000 µ.
	h := newHarness(t, `{"budgets":[{"tenant_id":"t0","currency":"USD","amount_micros":800000,"thresholds_percent":[50,100],"thresholds_micros":[100000]}]}`)
	h.rentals(t, stoppedRental("b-1", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 10*time.Minute).events())
	h.now = base.Add(11 * time.Minute)
	if err := errors.Join(h.fold(t)...); err != nil {
		t.Fatal(err)
	}
	want := []string{"budget:t0:monthly:2026-11:100000 0% spent 415000", "budget:t0:monthly:2026-11:400000 50% spent 415000"}
	if got := h.crossed(); !slices.Equal(got, want) {
		t.Fatalf("crossings %v, want %v", got, want)
	}
	for _, c := range h.crossings() {
		if !c.GetMeta().GetOccurredAt().AsTime().Equal(h.now) || c.Validate() != nil {
			t.Fatalf("crossing %v: want it valid and occurred at the clock", c)
		}
	}
	published := h.pub.Published()
	if err := errors.Join(h.fold(t)...); err != nil {
		t.Fatal(err)
	}
	if h.pub.Published() != published {
		t.Fatalf("redelivered records published %d more alerts", h.pub.Published()-published)
	}
	// The next rental reaches 100 %; its alert fails once and is alerted
	// on the redelivery.
	h.rentals(t, stoppedRental("b-2", shizuv1.Plan_PLAN_ON_DEMAND, 1, base.Add(20*time.Minute), 10*time.Minute).events())
	h.pub.FailWait = errors.New("stream unavailable")
	if errs := h.fold(t); errors.Join(errs...) == nil {
		t.Fatal("a failed alert was acknowledged")
	}
	h.pub.FailWait = nil
	if err := errors.Join(h.fold(t)...); err != nil {
		t.Fatal(err)
	}
	want = append(want, "budget:t0:monthly:2026-11:800000 100% spent 830000")
	if got := h.crossed(); !slices.Equal(got, want) {
		t.Fatalf("crossings %v, want %v", got, want)
	}
}

func TestHarnessAFailoverReportWithoutTheAttemptEndsThePlacementOnTheLostNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	moved := rental{id: "moved", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{
			{node: "node-2", start: base, stop: base.Add(time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_PREEMPTED},
			{node: "node-2", start: base.Add(2 * time.Minute), lost: base.Add(3*time.Minute + 20*time.Second)},
		}}
	h.rentals(t, moved.events())
	first, _ := h.store.Segment(ledger.SegmentRef{RentalID: "moved", Attempt: 1})
	second, due := h.store.Segment(ledger.SegmentRef{RentalID: "moved", Attempt: 2})
	if !first.LostAt.IsZero() || !second.LostAt.Equal(base.Add(3*time.Minute+20*time.Second)) || !second.Done || due.Listed {
		t.Fatalf("first lost at %s, second %+v: want only the running placement on node-2 ended at its last beat", first.LostAt, second)
	}
	h.assertBilled(t, "moved", 1, []billed{{base, 60, 2_490_000}, {base.Add(2 * time.Minute), 60, 2_490_000}, {base.Add(3 * time.Minute), 20, 2_490_000}})
}

func TestHarnessInputThatCannotBeBilledIsRefusedAsInvalidAndTheRestOfTheBatchGoesOn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	good := stoppedRental("good", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 30*time.Second)
	unknown := stoppedRental("tpu", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 30*time.Second)
	unknown.model = "TPU-v9"
	backwards := stoppedRental("backwards", shizuv1.Plan_PLAN_ON_DEMAND, 1, base, 30*time.Second)
	bevs := backwards.events()
	bevs[2].msg.(*shizuv1.RentalStopped).StoppedAt = timestamppb.New(base.Add(-time.Second))
	evs := append(append(good.events(), unknown.events()[0]), bevs[2])
	ds := append(deliveries(t, evs), bus.Delivery{Event: bus.EventName(&shizuv1.RentalStarted{}), Data: []byte{0xff}})
	errs := h.meter.HandleRentals(t.Context(), ds)
	for i, err := range errs {
		if wantInvalid := i >= 3; wantInvalid != fault.IsInvalid(err) || (!wantInvalid && err != nil) {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	h.assertBilled(t, "good", 1, []billed{{base, 30, 2_490_000}, {base.Add(30 * time.Second), 30, 2_490_000}})
}

// racingStore runs beforeLost just before it records a loss, as a batch
// handled at the same time as the failover report would.
type racingStore struct {
	*metertest.Store
	beforeLost func()
}

func (s *racingStore) Lost(ctx context.Context, rental string, attempt int32, lastHeartbeat time.Time) error {
	if f := s.beforeLost; f != nil {
		s.beforeLost = nil
		f()
	}
	return s.Store.Lost(ctx, rental, attempt, lastHeartbeat)
}

// A failover report that read the rental's placements before any was
// known, and records the loss after another batch merged the placement's
// schedule and start: the lost placement is still closed at once.
func TestHarnessAFailoverReportRacingItsPlacementsEventsStillClosesIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	r := rental{id: "raced", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: base, lost: base.Add(3*time.Minute + 30*time.Second)}}}
	evs := r.events() // scheduled, started, migrating
	store := &racingStore{Store: h.store}
	m, err := app.NewMeter(h.cfg, app.Deps{Store: store, Publisher: h.pub, Now: func() time.Time { return h.now }})
	if err != nil {
		t.Fatal(err)
	}
	h.meter = m
	store.beforeLost = func() { h.rentals(t, evs[:2]) }
	h.rentals(t, evs[2:])
	want := expectedLedger(t, h.cfg, []rental{r})
	got := h.usage()
	if len(want) != 4 || len(got) != len(want) {
		t.Fatalf("%d records published, want the lost placement's %d (4)", len(got), len(want))
	}
	for id, micros := range want {
		if got[id].GetAmount().GetMicros() != micros {
			t.Fatalf("record %s is %d µ, want %d", id, got[id].GetAmount().GetMicros(), micros)
		}
	}
}
