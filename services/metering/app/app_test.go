package app_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func allEvents(rentals []rental) []event {
	var out []event
	for _, r := range rentals {
		out = append(out, r.events()...)
	}
	return out
}

// prices publishes the spot history and waits until metering stored it.
func (e *env) prices(t testing.TB, cfg app.Config) {
	t.Helper()
	e.publish(t, spotEvents())
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	testkit.Eventually(t, 10*time.Second, func() error {
		got, err := store.SpotPrices(t.Context(), "eu-1", "H100-SXM5-80GB", time.Time{})
		if err != nil {
			return err
		}
		if len(got) != len(spotPrices) {
			return fmt.Errorf("%d spot prices stored", len(got))
		}
		return nil
	})
}

func TestOneCleanRunBillsEveryRecordOfEverySegment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(1, 40)
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, expectedLedger(t, cfg, rentals))
}

func TestDuplicatesAndRedeliveriesNeverDoubleCharge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(2, 30)
	evs := allEvents(rentals)
	e.publish(t, evs)
	// The same events again, under fresh message ids so the stream's
	// deduplication cannot help: the consumers see every one twice.
	js := e.pub.JetStream()
	for i, ev := range evs {
		data, err := proto.Marshal(ev.msg)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(ev.subject)
		m.Data = data
		m.Header.Set(bus.HeaderEvent, string(ev.msg.ProtoReflect().Descriptor().FullName()))
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dup-%d", i))
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	want := expectedLedger(t, cfg, rentals)
	e.settled(t, cfg.KeyPrefix, want)
	// Usage records published twice (a second replica, a replay after the
	// stream's duplicate window) are folded into the aggregates once.
	billing, err := js.Stream(t.Context(), topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		msg, err := billing.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(msg.Subject)
		m.Data = msg.Data
		m.Header.Set(bus.HeaderEvent, "shizu.v1.UsageRecorded")
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("replay-%d", seq))
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	if _, n := e.billed(t); n != len(want)+5 {
		t.Fatalf("stream holds %d usage messages, want %d (5 replayed)", n, len(want)+5)
	}
	e.settled(t, cfg.KeyPrefix, want)
}

func TestEventsArrivingOutOfOrderAreBilledRight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(3, 30)
	// Each rental's events backwards: stopped before started before
	// scheduled; and rentals shuffled among each other.
	var evs []event
	for _, r := range rentals {
		re := r.events()
		for i := len(re) - 1; i >= 0; i-- {
			evs = append(evs, re[i])
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	e.publish(t, evs)
	e.settled(t, cfg.KeyPrefix, expectedLedger(t, cfg, rentals))
}

func TestKillingAReplicaMidStreamOrRunningTwoGivesTheCleanRunsLedger(t *testing.T) {
	t.Parallel()
	rentals := randomRentals(4, 60)
	cfg := testConfig()
	want := expectedLedger(t, cfg, rentals)

	// The clean run handles one event at a time; the replicas below batch
	// (in large batches, and in small ones that split a rental's events).
	one := cfg
	one.Batch = 1
	clean := newEnv(t)
	clean.startMeter(t, one, fixed(base))
	clean.prices(t, cfg)
	clean.publish(t, allEvents(rentals))
	clean.settled(t, cfg.KeyPrefix, want)
	cleanLedger, _ := clean.billed(t)
	cleanAgg, err := aggregatesOf(clean.rdb, cfg.KeyPrefix).Dump(t.Context(), "0")
	if err != nil {
		t.Fatal(err)
	}

	e := newEnv(t)
	small := cfg
	small.Batch, small.Concurrency = 7, 2
	a := e.startMeter(t, cfg, fixed(base))
	e.startMeter(t, small, fixed(base)) // a second replica throughout
	e.prices(t, cfg)
	evs := allEvents(rentals)
	e.publish(t, evs[:len(evs)/2])
	testkit.Eventually(t, 20*time.Second, func() error { // mid-stream: some billed, more to come
		if got, _ := e.billed(t); len(got) < len(want)/5 {
			return fmt.Errorf("%d records billed so far", len(got))
		}
		return nil
	})
	a.kill() // without draining or acknowledging
	e.startMeter(t, small, fixed(base))
	e.publish(t, evs[len(evs)/2:])
	e.settled(t, cfg.KeyPrefix, want)

	got, _ := e.billed(t)
	if strings.Join(sortedIDs(got), ",") != strings.Join(sortedIDs(cleanLedger), ",") || total(got) != total(cleanLedger) {
		t.Fatalf("ledger differs from the clean run: %d records / %d µ vs %d / %d", len(got), total(got), len(cleanLedger), total(cleanLedger))
	}
	agg, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Dump(t.Context(), "0")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(agg) != fmt.Sprint(cleanAgg) {
		t.Fatalf("aggregates differ from the clean run:\n%v\n%v", agg, cleanAgg)
	}
}

func TestRebuildFromTheStreamReproducesTheAggregatesExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(5, 40)
	e.publish(t, allEvents(rentals))
	want := expectedLedger(t, cfg, rentals)
	e.settled(t, cfg.KeyPrefix, want)
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	before, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Dump(t.Context(), "0")
	if err != nil {
		t.Fatal(err)
	}
	res, err := app.Rebuild(t.Context(), e.pub, store)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if res.Generation == "0" || res.Applied != len(want) || res.Invalid != 0 {
		t.Fatalf("rebuild %+v, want a new generation with %d records", res, len(want))
	}
	after, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Dump(t.Context(), res.Generation)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) == 0 || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rebuilt aggregates differ:\n%v\n%v", after, before)
	}
	if old, _ := aggregatesOf(e.rdb, cfg.KeyPrefix).Dump(t.Context(), "0"); len(old) != 0 {
		t.Fatalf("old generation not dropped: %d keys", len(old))
	}
	// Queries read the rebuilt generation.
	var sum int64
	for _, tenant := range []string{"t0", "t1", "t2"} {
		v, _ := aggregatesOf(e.rdb, cfg.KeyPrefix).TenantTotal(t.Context(), tenant, "USD")
		sum += v
	}
	if sum != total(want) {
		t.Fatalf("totals after rebuild %d, want %d", sum, total(want))
	}
}

func deadLetters(t testing.TB, e *env) []jetstream.RawStreamMsg {
	t.Helper()
	s, err := e.pub.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err == nil {
			out = append(out, *m)
		}
	}
	return out
}

func TestBadInputIsDeadLetteredWithAReasonAndChangesNoTotal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	good := randomRentals(6, 10)
	e.publish(t, allEvents(good))
	want := expectedLedger(t, cfg, good)
	e.settled(t, cfg.KeyPrefix, want)

	unknown := rental{id: "bad-model", tenant: "t0", model: "b300", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND,
		gpus: 1, milli: 1000, segs: []seg{{node: "node-1", start: base, stop: base.Add(time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
	// A stop stamped before its start is dead-lettered too, but ends the
	// run: TestAStopStampedBeforeItsStartEndsTheRunAtWhatWasBilledAndIsFlagged.
	e.publish(t, unknown.events())
	badSpot, _ := subject.Format(subject.SpotPriceChanged, "eu-1", "H100-SXM5-80GB")
	e.publish(t, []event{{badSpot, &shizuv1.SpotPriceChanged{Meta: meta("spot:eu-1:H100-SXM5-80GB:eur", base), Model: "H100-SXM5-80GB", Zone: "eu-1",
		PricePerGpuHour: &shizuv1.Money{Micros: 1, Currency: "EUR"}, EffectiveAt: timestamppb.New(base)}}})
	stopped, _ := subject.Format(subject.RentalStopped, "t2")
	m := nats.NewMsg(stopped)
	m.Data = []byte("\xff\x00 not protobuf")
	m.Header.Set(bus.HeaderEvent, "shizu.v1.RentalStopped")
	m.Header.Set(jetstream.MsgIDHeader, "garbage-1")
	if _, err := e.pub.JetStream().PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}

	wantReasons := []string{`unknown GPU model "b300"`, "EUR", "decode shizu.v1.RentalStopped"}
	testkit.Eventually(t, 20*time.Second, func() error {
		var reasons []string
		for _, dl := range deadLetters(t, e) {
			reasons = append(reasons, dl.Header.Get(bus.HeaderDLQReason))
		}
		all := strings.Join(reasons, "\n")
		for _, w := range wantReasons {
			if !strings.Contains(all, w) {
				return fmt.Errorf("no dead letter says %q; have:\n%s", w, all)
			}
		}
		return nil
	})
	e.settled(t, cfg.KeyPrefix, want)
	for _, id := range []string{"bad-model"} {
		if micros, mgs, _ := aggregatesOf(e.rdb, cfg.KeyPrefix).Rental(t.Context(), id); micros != 0 || mgs != 0 {
			t.Fatalf("rental %s was billed %d µ", id, micros)
		}
	}
}

func TestRunningRentalsAreClosedAtEveryIntervalBoundary(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	var now atomic.Int64
	now.Store(base.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	r := e.startMeter(t, cfg, clock)
	running := rental{id: "long", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 2, milli: 1000,
		segs: []seg{{node: "node-1", start: base.Add(15 * time.Second)}}}
	e.publish(t, running.events())
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	testkit.Eventually(t, 10*time.Second, func() error {
		st, err := segment(t.Context(), store, ledger.SegmentRef{RentalID: "long", Attempt: 1})
		if err != nil {
			return err
		}
		if st.StartedAt.IsZero() || !st.Scheduled {
			return errors.New("not started yet")
		}
		return nil
	})
	// Five minutes later, closing due intervals bills the four whole
	// minutes that have passed the grace and are closed.
	now.Store(base.Add(5*time.Minute + cfg.CloseGrace).UnixNano())
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.meter.CloseDue(t.Context()); err != nil { // idempotent
		t.Fatal(err)
	}
	want := map[string]int64{}
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("H100-SXM5-80GB")
	sg, _ := running.state(cat, 0).Segment()
	recs, _, _ := ledger.Close(sg, ledger.Tariff{Base: list}, cfg.Rules, time.Time{}, base.Add(5*time.Minute))
	for _, rec := range recs {
		want[rec.ID] = rec.Amount.Micros
	}
	if len(want) != 5 { // [0:15,1:00) then four whole minutes
		t.Fatalf("expected 5 records, computed %d", len(want))
	}
	e.settled(t, cfg.KeyPrefix, want)
}

func TestTheMeteringUserMayMeterRebuildAndInvoice(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	cfg := testConfig()
	r := e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(7, 20)
	e.publish(t, allEvents(rentals))
	want := expectedLedger(t, cfg, rentals)
	e.settled(t, cfg.KeyPrefix, want)
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	if _, err := app.Rebuild(t.Context(), r.conn, store); err != nil {
		t.Fatalf("rebuild as the metering user: %v", err)
	}
	day := base.Truncate(24 * time.Hour)
	inv, err := app.CloseInvoice(t.Context(), cfg, r.conn, store, "t0", day, day.AddDate(0, 0, 1))
	if err != nil {
		t.Fatalf("invoice as the metering user: %v", err)
	}
	// On-demand and spot lines are the sums of the tenant's records;
	// reserved usage without a commitment is all overage, billed at the
	// on-demand list price on the on-demand line.
	var onDemand, spot, reservedMGS int64
	for _, rt := range rentals {
		if rt.tenant != "t0" {
			continue
		}
		micros, mgs, _ := aggregatesOf(e.rdb, cfg.KeyPrefix).Rental(t.Context(), rt.id)
		switch rt.plan {
		case shizuv1.Plan_PLAN_ON_DEMAND:
			onDemand += micros
		case shizuv1.Plan_PLAN_SPOT:
			spot += micros
		case shizuv1.Plan_PLAN_RESERVED:
			reservedMGS += mgs
		}
	}
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("H100-SXM5-80GB")
	onDemand += ledger.AmountMicros(list.Micros, 1, 1, reservedMGS)
	for _, l := range inv.Lines {
		want := map[shizuv1.Plan]int64{shizuv1.Plan_PLAN_ON_DEMAND: onDemand, shizuv1.Plan_PLAN_SPOT: spot}[l.Plan]
		if l.Amount.Micros != want {
			t.Fatalf("invoice line %s/%s is %d µ, the records say %d", l.Plan, l.Model, l.Amount.Micros, want)
		}
	}
	if inv.Total.Micros != onDemand+spot || len(inv.Lines) == 0 {
		t.Fatalf("invoice total %d µ, want %d", inv.Total.Micros, onDemand+spot)
	}
	s, _ := e.pub.JetStream().Stream(t.Context(), topology.StreamBilling)
	msg, err := s.GetLastMsgForSubject(t.Context(), "invoice.t0.closed")
	if err != nil {
		t.Fatalf("no invoice published: %v", err)
	}
	var ev shizuv1.InvoiceClosed
	if err := proto.Unmarshal(msg.Data, &ev); err != nil || ev.Validate() != nil || ev.GetTotal().GetMicros() != inv.Total.Micros {
		t.Fatalf("published invoice %v does not match (%v)", &ev, err)
	}
	if ev.GetInvoiceId() != "invoice:t0:2026-11-02T00:00:00Z" {
		t.Fatalf("invoice id %q", ev.GetInvoiceId())
	}
}

func TestBudgetAlertsAndTheLabelReportFollowTheSpend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	accounts := filepath.Join(t.TempDir(), "accounts.json")
	if err := os.WriteFile(accounts, []byte(`{"budgets":[{"tenant_id":"t0","currency":"USD","thresholds_micros":[1000,1000000000000]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AccountsPath = accounts
	e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(8, 30)
	e.publish(t, allEvents(rentals))
	want := expectedLedger(t, cfg, rentals)
	e.settled(t, cfg.KeyPrefix, want)
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	rep, err := app.MonthReport(t.Context(), store, "t0", base)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.CrossedMicros) != 1 || rep.CrossedMicros[0] != 1000 {
		t.Fatalf("crossed %v, want only the 1000 µ threshold", rep.CrossedMicros)
	}
	tenantTotal, _ := aggregatesOf(e.rdb, cfg.KeyPrefix).TenantTotal(t.Context(), "t0", "USD")
	if rep.ByLabel["team=vision|USD"]+rep.ByLabel["team=nlp|USD"] != tenantTotal || tenantTotal == 0 {
		t.Fatalf("label report %v does not add up to the tenant's %d µ", rep.ByLabel, tenantTotal)
	}
}

func TestTheCloserBillsRunningRentalsAsTheClockPassesBoundaries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	var now atomic.Int64
	now.Store(base.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	e.startMeterTicking(t, cfg, clock, 10*time.Millisecond)
	running := rental{id: "ticking", tenant: "t1", model: "A100-SXM4-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 500,
		labels: map[string]string{"team": "nlp"}, segs: []seg{{node: "node-1", start: base}}}
	e.publish(t, running.events())
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("A100-SXM4-80GB")
	sg, _ := running.state(cat, 0).Segment()
	want := map[string]int64{}
	for minute := 1; minute <= 3; minute++ {
		now.Store(base.Add(time.Duration(minute)*time.Minute + cfg.CloseGrace).UnixNano())
		recs, _, _ := ledger.Close(sg, ledger.Tariff{Base: list}, cfg.Rules, time.Time{}, base.Add(time.Duration(minute)*time.Minute))
		for _, r := range recs {
			want[r.ID] = r.Amount.Micros
		}
		e.settled(t, cfg.KeyPrefix, want)
	}
	if len(want) != 3 {
		t.Fatalf("want one record per minute, computed %d", len(want))
	}
}

func TestReservedRentalsAreRecordedAtTheirCommitmentsRate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	accounts := filepath.Join(t.TempDir(), "accounts.json")
	if err := os.WriteFile(accounts, []byte(`{"commitments":[{"tenant_id":"t0","model":"H100-SXM5-80GB","gpu_count":4,"term":"year","start":"2026-01-01T00:00:00Z","discount_percent":75}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AccountsPath = accounts
	e.startMeter(t, cfg, fixed(base))
	r := rental{id: "res", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_RESERVED, gpus: 4, milli: 1000,
		segs: []seg{{node: "node-1", start: base, stop: base.Add(90 * time.Second), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
	e.publish(t, r.events())
	// 2,490,000 a GPU-hour at 75 % off is 622,500; 4 GPUs for 90 s.
	e.settled(t, cfg.KeyPrefix, map[string]int64{
		"usage:res:2026-11-02T09:00:00Z": ledger.AmountMicros(622_500, 4, 1000, 60),
		"usage:res:2026-11-02T09:01:00Z": ledger.AmountMicros(622_500, 4, 1000, 30),
	})
}

func TestTheRebuildInvoiceAndReportCommandsRunAsTheMeteringUser(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	cfg := testConfig()
	e.startMeter(t, cfg, fixed(base))
	rentals := randomRentals(9, 10)
	for i := range rentals {
		rentals[i].plan, rentals[i].maxSpot = shizuv1.Plan_PLAN_ON_DEMAND, nil
	}
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, expectedLedger(t, cfg, rentals))
	common := []string{"-nats-url", e.NATS.URL, "-nats-user", topology.Metering, "-nats-password", testkit.Password(topology.Metering),
		"-redis-url", e.RedisURL(), "-log-level", "error"}
	run := func(name string, args ...string) (int, string, string) {
		var out, errb strings.Builder
		code := app.Command(t.Context(), name, append(append([]string{}, common...), args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errb := run("rebuild"); code != 0 || !strings.Contains(out, `"Generation": "1"`) {
		t.Fatalf("rebuild: exit %d\n%s\n%s", code, out, errb)
	}
	code, out, errb := run("invoice", "-tenant", "t1", "-from", "2026-11-02", "-to", "2026-11-03")
	if code != 0 || !strings.Contains(out, `"ID": "invoice:t1:2026-11-02T00:00:00Z"`) {
		t.Fatalf("invoice: exit %d\n%s\n%s", code, out, errb)
	}
	if code, out, errb := run("report", "-tenant", "t1", "-month", "2026-11"); code != 0 || !strings.Contains(out, "team=") {
		t.Fatalf("report: exit %d\n%s\n%s", code, out, errb)
	}
	if code, _, errb := run("invoice", "-tenant", "t1", "-from", "yesterday"); code != 2 || !strings.Contains(errb, "-from") {
		t.Fatalf("a bad date: exit %d, %s", code, errb)
	}
}

// budgetCrossings reads every budget crossing in the BILLING stream.
func (e *env) budgetCrossings(t testing.TB) []*shizuv1.BudgetThresholdCrossed {
	t.Helper()
	ctx := t.Context()
	s, err := e.pub.JetStream().Stream(ctx, topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*shizuv1.BudgetThresholdCrossed
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get %d: %v", seq, err)
		}
		if !subject.Matches(subject.UsageBudgetCrossedAll, m.Subject) {
			continue
		}
		ev := &shizuv1.BudgetThresholdCrossed{}
		if err := proto.Unmarshal(m.Data, ev); err != nil {
			t.Fatal(err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("invalid crossing on %s: %v", m.Subject, err)
		}
		out = append(out, ev)
	}
	return out
}

// drained waits until the usage consumer has nothing pending.
func (e *env) drained(t testing.TB) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, func() error {
		info, err := e.consumerInfo(t.Context(), topology.StreamBilling, "metering-usage")
		if err != nil {
			return err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("%d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		return nil
	})
}

func TestBudgetCrossingsArePublishedOncePerThresholdAndPeriod(t *testing.T) {
	t.Parallel()
	if subject.Matches(subject.UsageRecordedAll, "usage.t0.budget_crossed") {
		t.Fatal("the usage consumer's filter would receive budget crossings")
	}
	e := newEnvWithUsers(t) // the meter publishes as the metering user
	cfg := testConfig()
	// Ten on-demand rentals of tenant t0; its budget is exactly their cost.
	var rentals []rental
	for i := range 10 {
		start := base.Add(time.Duration(i) * time.Minute)
		rentals = append(rentals, rental{id: fmt.Sprintf("b-%d", i), tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1",
			plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 2, milli: 1000, labels: map[string]string{"team": "vision"},
			segs: []seg{{node: "node-1", start: start, stop: start.Add(7 * time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}})
	}
	want := expectedLedger(t, cfg, rentals)
	budget := total(want)
	accounts := filepath.Join(t.TempDir(), "accounts.json")
	doc := fmt.Sprintf(`{"budgets":[{"id":"team-budget","tenant_id":"t0","currency":"USD","amount_micros":%d,"thresholds_percent":[50,80,100]}]}`, budget)
	if err := os.WriteFile(accounts, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AccountsPath = accounts
	e.startMeter(t, cfg, fixed(base))
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, want)
	e.drained(t)

	got := e.budgetCrossings(t)
	sort.Slice(got, func(i, j int) bool { return got[i].GetThreshold().GetMicros() < got[j].GetThreshold().GetMicros() })
	if len(got) != 3 {
		t.Fatalf("%d crossings published, want 3 (50, 80 and 100 %%): %v", len(got), got)
	}
	ids := map[string]bool{}
	for i, pct := range []int32{50, 80, 100} {
		ev := got[i]
		if ev.GetThresholdPercent() != pct || ev.GetThreshold().GetMicros() != budget*int64(pct)/100 ||
			ev.GetBudgetAmount().GetMicros() != budget || ev.GetBudgetId() != "team-budget" || ev.GetTenantId() != "t0" ||
			!ev.GetPeriodStart().AsTime().Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) {
			t.Fatalf("crossing %d is %v, want %d %% of %d µ in November 2026", i, ev, pct, budget)
		}
		ids[ev.GetMeta().GetEventId()] = true
	}
	if len(ids) != 3 {
		t.Fatalf("crossing ids %v are not distinct", ids)
	}

	// The usage records delivered again (under fresh message ids, as after
	// the stream's duplicate window): no new crossing.
	js := e.pub.JetStream()
	billing, err := js.Stream(t.Context(), topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	replay := func(seq uint64, id string) {
		msg, err := billing.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if !subject.Matches(subject.UsageRecordedAll, msg.Subject) {
			return
		}
		m := nats.NewMsg(msg.Subject)
		m.Data = msg.Data
		m.Header.Set(bus.HeaderEvent, msg.Header.Get(bus.HeaderEvent))
		m.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	info, err := billing.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		replay(seq, fmt.Sprintf("replay-%d", seq))
	}
	e.drained(t)
	e.settled(t, cfg.KeyPrefix, want)
	if n := len(e.budgetCrossings(t)); n != 3 {
		t.Fatalf("%d crossings in the stream after the redelivery, want still 3", n)
	}

	// A crash after publishing a crossing but before marking it alerted:
	// the next record republishes it under the same id, which the stream
	// stores once.
	if err := e.rdb.Del(t.Context(), cfg.KeyPrefix+"alerts:t0:2026-11").Err(); err != nil {
		t.Fatal(err)
	}
	replay(info.State.FirstSeq, "replay-again")
	e.drained(t)
	if n := len(e.budgetCrossings(t)); n != 3 {
		t.Fatalf("%d crossings in the stream after re-alerting, want still 3", n)
	}
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	alerted, err := store.Alerts(t.Context(), "t0", "2026-11")
	if err != nil || len(alerted) != 3 {
		t.Fatalf("alerted %v (%v), want the three thresholds marked again", alerted, err)
	}
}

// Before a zone's first spot price, spot seconds are billed at the
// catalogue's spot default of the model (not its list price), and the
// tenant's maximum is compared with that default.
func TestSpotBeforeTheFirstMarketPriceIsBilledAtTheCataloguesSpotDefault(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../pricing/catalogue.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, it := range doc["instance_types"].([]any) {
		if it := it.(map[string]any); it["model"] == "H100-SXM5-80GB" {
			it["spot_default_price_per_gpu_hour_micros"] = 1_080_000 // 300 µ a GPU-second; list is 2,490,000
		}
	}
	cat := filepath.Join(t.TempDir(), "catalogue.json")
	if data, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cat, data, 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	cfg := testConfig()
	cfg.CataloguePath = cat
	e.startMeter(t, cfg, fixed(base))
	spot := func(id string, maxMicros int64) rental {
		return rental{id: id, tenant: "t1", model: "H100-SXM5-80GB", zone: "eu-9", plan: shizuv1.Plan_PLAN_SPOT, gpus: 2, milli: 1000,
			maxSpot: &pricing.Money{Micros: maxMicros, Currency: "USD"}, labels: map[string]string{"team": "nlp"},
			segs: []seg{{node: "node-3", start: base, stop: base.Add(10 * time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
	}
	// Capped between the default and the list price, and capped below the
	// default; no market price of eu-9 is ever published.
	e.publish(t, allEvents([]rental{spot("s-above", 1_500_000), spot("s-below", 1_000_000)}))
	testkit.Eventually(t, 30*time.Second, func() error {
		if err := e.busy(t.Context()); err != nil {
			return err
		}
		micros, _, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Rental(t.Context(), "s-above")
		if err != nil {
			return err
		}
		if micros == 0 {
			return errors.New("s-above not billed yet")
		}
		return nil
	})
	above, _, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Rental(t.Context(), "s-above")
	if err != nil {
		t.Fatal(err)
	}
	if above != 2*600*300 {
		t.Fatalf("10 minutes of 2 GPUs billed %d µ, want %d (the spot default, not the list price)", above, 2*600*300)
	}
	if below, _, err := aggregatesOf(e.rdb, cfg.KeyPrefix).Rental(t.Context(), "s-below"); err != nil || below != 0 {
		t.Fatalf("a rental capped below the spot default billed %d µ (%v), want nothing", below, err)
	}
}

func TestTheCloserTakesFinishedSegmentsOffTheDueList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	r := e.startMeter(t, cfg, fixed(base.Add(10*time.Minute)))
	done := rental{id: "done", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: base, stop: base.Add(90 * time.Second), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}
	e.publish(t, done.events())
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	ref := ledger.SegmentRef{RentalID: "done", Attempt: 1}
	// Finished, and every event handled and acknowledged: a start merged
	// after the stop finished the segment (its batch ran late) or a
	// redelivery would take the member below off the list before the
	// closer looks.
	testkit.Eventually(t, 10*time.Second, func() error {
		st, err := segment(t.Context(), store, ref)
		if err != nil {
			return err
		}
		if !st.Done {
			return errors.New("not finished yet")
		}
		return e.busy(t.Context())
	})
	// A member left on the due list by an earlier version, which made
	// finished segments due again on a redelivered start or stop.
	if err := e.rdb.ZAdd(t.Context(), cfg.KeyPrefix+"due", redis.Z{Score: float64(base.Unix()), Member: "done 1"}).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := r.meter.CloseDue(t.Context()); err != nil || n != 1 {
		t.Fatalf("closer looked at %d segments (%v), want the stale one", n, err)
	}
	if refs, err := store.Due(t.Context(), base.Add(time.Hour), 10_000); err != nil || len(refs) != 0 {
		t.Fatalf("due %v (%v), want nothing", refs, err)
	}
	if st, err := segment(t.Context(), store, ref); err != nil || !st.Done || !st.Cursor.Equal(base.Add(90*time.Second)) {
		t.Fatalf("segment %+v (%v), want done with its cursor at the stop", st, err)
	}
}

func TestAFailoverThatDidNotKnowTheAttemptEndsThePlacementOnTheLostNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := testConfig()
	r := e.startMeter(t, cfg, fixed(base.Add(10*time.Minute)))
	moved := rental{id: "moved", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{
			{node: "node-1", start: base, stop: base.Add(time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_PREEMPTED},
			{node: "node-2", start: base.Add(2 * time.Minute), lost: base.Add(3 * time.Minute)},
		}}
	evs := moved.events()
	migrating := evs[len(evs)-1]
	if mig, ok := migrating.msg.(*shizuv1.RentalMigrating); !ok || mig.GetFromAttempt() != 0 || mig.GetFromNodeId() != "node-2" {
		t.Fatalf("last event %v, want a migration off node-2 that names no attempt", migrating.msg)
	}
	e.publish(t, evs[:len(evs)-1])
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	second := ledger.SegmentRef{RentalID: "moved", Attempt: 2}
	testkit.Eventually(t, 10*time.Second, func() error {
		st, err := segment(t.Context(), store, second)
		if err != nil {
			return err
		}
		if !st.Scheduled || st.StartedAt.IsZero() {
			return errors.New("second placement not known yet")
		}
		return nil
	})
	e.publish(t, []event{migrating})
	testkit.Eventually(t, 10*time.Second, func() error {
		st, err := segment(t.Context(), store, second)
		if err != nil {
			return err
		}
		if !st.Done {
			return fmt.Errorf("second placement not ended (lost at %s)", st.LostAt)
		}
		return nil
	})
	first, err := segment(t.Context(), store, ledger.SegmentRef{RentalID: "moved", Attempt: 1})
	if err != nil || !first.LostAt.IsZero() {
		t.Fatalf("first placement lost at %s (%v); the failover was about the second", first.LostAt, err)
	}
	cat, _ := cfg.Catalogue()
	list, _ := cat.OnDemand("H100-SXM5-80GB")
	want := map[string]int64{}
	for i := range moved.segs {
		sg, _ := moved.state(cat, i).Segment()
		recs, _, _ := ledger.Close(sg, ledger.Tariff{Base: list}, cfg.Rules, time.Time{}, sg.End)
		for _, rec := range recs {
			want[rec.ID] = rec.Amount.Micros
		}
	}
	if _, err := r.meter.CloseDue(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.settled(t, cfg.KeyPrefix, want)
}
