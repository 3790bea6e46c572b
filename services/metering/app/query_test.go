package app_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/billing"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// records are the distinct usage records of the BILLING stream, read as
// the admin: the oracle the answers are checked against.
func (e *env) records(t *testing.T) []*shizuv1.UsageRecorded {
	t.Helper()
	s, err := e.pub.JetStream().Stream(t.Context(), topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []*shizuv1.UsageRecorded
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(t.Context(), seq)
		if err != nil {
			t.Fatal(err)
		}
		ev := &shizuv1.UsageRecorded{}
		if !subject.Matches(subject.UsageRecordedAll, m.Subject) || proto.Unmarshal(m.Data, ev) != nil || seen[ev.GetMeta().GetEventId()] {
			continue
		}
		seen[ev.GetMeta().GetEventId()] = true
		out = append(out, ev)
	}
	return out
}

// expectedRows sums the records of tenant by groupBy, as the answer must.
func expectedRows(recs []*shizuv1.UsageRecorded, tenant, groupBy string) []billing.UsageRow {
	sums := map[[2]string]*billing.UsageRow{}
	add := func(key, plan string, r *shizuv1.UsageRecorded, secs int64) {
		row := sums[[2]string{key, plan}]
		if row == nil {
			row = &billing.UsageRow{Key: key, Plan: plan}
			sums[[2]string{key, plan}] = row
		}
		row.AmountMicros += r.GetAmount().GetMicros()
		row.MilliGPUSeconds += int64(r.GetGpuCount()) * int64(r.GetMilliGpu()) * r.GetSeconds()
		row.Seconds += secs
	}
	for _, r := range recs {
		if r.GetTenantId() != tenant {
			continue
		}
		switch groupBy {
		case billing.ByRental:
			add(r.GetRentalId(), "", r, r.GetSeconds())
		case billing.ByModel:
			add(r.GetModel(), redisstore.PlanName(r.GetPlan()), r, 0)
		case billing.ByDay:
			add(r.GetIntervalStart().AsTime().UTC().Format(time.DateOnly), "", r, 0)
		case billing.ByLabel:
			for k, v := range r.GetLabels() {
				add(k+"="+v, "", r, 0)
			}
		}
	}
	out := []billing.UsageRow{}
	for _, row := range sums {
		out = append(out, *row)
	}
	slices.SortFunc(out, func(a, b billing.UsageRow) int {
		if a.Key != b.Key {
			if a.Key < b.Key {
				return -1
			}
			return 1
		}
		if a.Plan < b.Plan {
			return -1
		}
		if a.Plan > b.Plan {
			return 1
		}
		return 0
	})
	return out
}

func ask[A billing.Answer](t *testing.T, ctx context.Context, e *env, form, tenant string, req any, ans A) error {
	t.Helper()
	gw := e.Connect(t, topology.Gateway) // the gateway's user asks
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return billing.Ask(ctx, gw.NATS(), form, tenant, req, ans)
}

// Metering answers usage, invoices and budgets as the metering user, to
// the gateway's user, from its aggregates and the BILLING stream: each
// answer is the tenant's of the subject and never holds another
// tenant's rows.
func TestMoneyQueriesAnswerTheSubjectsTenantFromTheAggregates(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	cfg := testConfig()
	cfg.AccountsPath = filepath.Join(t.TempDir(), "accounts.json")
	if err := os.WriteFile(cfg.AccountsPath, []byte(`{"budgets": [{"tenant_id": "t0", "currency": "USD",
		"amount_micros": 1000000, "thresholds_percent": [1, 1000], "thresholds_micros": [5]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.startMeter(t, cfg, fixed(base))
	e.prices(t, cfg)
	rentals := randomRentals(11, 24)
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, expectedLedger(t, cfg, rentals))
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	reader := sdkmetric.NewManualReader()
	q, err := app.ServeQueries(t.Context(), cfg, app.QueryDeps{Conn: r.conn, Store: store, Log: quietLog(t), Now: fixed(base),
		Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Stop(context.WithoutCancel(t.Context())) })
	day := billing.UsageQuery{From: "2026-11-02", To: "2026-11-03", GroupBy: billing.ByDay}

	// Until the store is marked rebuilt, nothing is answered from it.
	var ans billing.UsageAnswer
	if err := ask(t, t.Context(), e, subject.UsageQuery, "t0", day, &ans); !errors.Is(err, billing.ErrUnavailable) {
		t.Fatalf("a query before the store is ready: %v, want unavailable", err)
	}
	if err := store.MarkReady(t.Context(), base); err != nil {
		t.Fatal(err)
	}
	recs := e.records(t)
	for _, tenant := range []string{"t0", "t1", "t2", "nobody"} {
		for _, g := range []string{billing.ByRental, billing.ByModel, billing.ByDay, billing.ByLabel} {
			q := day
			q.GroupBy = g
			var ans billing.UsageAnswer
			if err := ask(t, t.Context(), e, subject.UsageQuery, tenant, q, &ans); err != nil {
				t.Fatalf("%s by %s: %v", tenant, g, err)
			}
			want := expectedRows(recs, tenant, g)
			if ans.Currency != "USD" || !slices.Equal(ans.Rows, want) {
				t.Fatalf("%s by %s:\n got %+v\nwant %+v", tenant, g, ans.Rows, want)
			}
			if tenant != "nobody" && len(want) == 0 {
				t.Fatalf("%s by %s: the test rentals billed nothing", tenant, g)
			}
		}
	}
	// A day with no usage has no rows; a bad request names its field.
	if err := ask(t, t.Context(), e, subject.UsageQuery, "t0", billing.UsageQuery{From: "2026-11-03", To: "2026-11-30", GroupBy: "day"}, &ans); err != nil || len(ans.Rows) != 0 {
		t.Fatalf("days without usage: %v %+v", err, ans.Rows)
	}
	var be *billing.Error
	if err := ask(t, t.Context(), e, subject.UsageQuery, "t0", map[string]any{"from": "2026-11-02", "to": "2026-11-03", "group_by": "week"}, &ans); !errors.As(err, &be) || be.Field != "group_by" {
		t.Fatalf("group_by week: %v", err)
	}
	if err := ask(t, t.Context(), e, subject.UsageQuery, "t0", map[string]any{"tenant": "t1"}, &ans); !errors.As(err, &be) || be.Field != "body" {
		t.Fatalf("a body naming a tenant: %v", err)
	}
	checkBudgets(t, e, recs)
	checkInvoices(t, e, cfg, r)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	// 1 unavailable, 16 by tenant and grouping, 1 empty, 2 invalid; 2
	// budgets; 4 invoice pages.
	if n := counterSum(rm, "shizu.metering.queries"); n != 26 {
		t.Fatalf("shizu.metering.queries counted %d answers, want 26", n)
	}
}

func spendOf(recs []*shizuv1.UsageRecorded, tenant string) int64 {
	var n int64
	for _, r := range recs {
		if r.GetTenantId() == tenant {
			n += r.GetAmount().GetMicros()
		}
	}
	return n
}

func checkBudgets(t *testing.T, e *env, recs []*shizuv1.UsageRecorded) {
	t.Helper()
	var b billing.BudgetAnswer
	if err := ask(t, t.Context(), e, subject.BudgetQuery, "t0", billing.BudgetQuery{}, &b); err != nil {
		t.Fatal(err)
	}
	spend := spendOf(recs, "t0")
	if b.Month != "2026-11" || b.SpendMicros != spend || b.Budget == nil || b.Budget.ID != "monthly" || len(b.Budget.Thresholds) != 3 ||
		b.Budget.Policy != "alert" || b.Budget.GraceSeconds != 0 {
		t.Fatalf("t0's budget: %+v (spend %d)", b, spend)
	}
	for _, th := range b.Budget.Thresholds {
		if th.Reached != (spend >= th.Micros) {
			t.Fatalf("threshold %+v: reached %v with spend %d", th, th.Reached, spend)
		}
	}
	if th := b.Budget.Thresholds[0]; th.Micros != 5 || !th.Alerted {
		t.Fatalf("the 5 µ threshold: %+v, want alerted (the spend passed it)", th)
	}
	var other billing.BudgetAnswer
	if err := ask(t, t.Context(), e, subject.BudgetQuery, "t1", nil, &other); err != nil || other.Budget != nil || other.SpendMicros != spendOf(recs, "t1") {
		t.Fatalf("t1 (no budget): %+v %v; want its own spend %d", other, err, spendOf(recs, "t1"))
	}
}

func checkInvoices(t *testing.T, e *env, cfg app.Config, r *replica) {
	t.Helper()
	store := redisstore.New(e.rdb, cfg.KeyPrefix)
	day := base.Truncate(24 * time.Hour)
	for _, p := range []struct {
		tenant string
		from   time.Time
	}{{"t0", day}, {"t1", day}, {"t0", day.AddDate(0, 0, 1)}} {
		if _, err := app.CloseInvoice(t.Context(), cfg, r.conn, store, p.tenant, p.from, p.from.AddDate(0, 0, 1)); err != nil {
			t.Fatal(err)
		}
	}
	before := e.consumerCount(t)
	var page billing.InvoicesAnswer
	if err := ask(t, t.Context(), e, subject.InvoicesQuery, "t0", billing.InvoicesQuery{Limit: 1}, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Invoices) != 1 || page.Next == 0 || page.Invoices[0].ID != "invoice:t0:2026-11-02T00:00:00Z" ||
		page.Invoices[0].TotalMicros == 0 || len(page.Invoices[0].Lines) == 0 {
		t.Fatalf("t0's first page: %+v", page)
	}
	var next billing.InvoicesAnswer
	if err := ask(t, t.Context(), e, subject.InvoicesQuery, "t0", billing.InvoicesQuery{After: page.Next, Limit: 1}, &next); err != nil {
		t.Fatal(err)
	}
	if len(next.Invoices) != 1 || next.Next != 0 || next.Invoices[0].ID != "invoice:t0:2026-11-03T00:00:00Z" || next.Invoices[0].TotalMicros != 0 {
		t.Fatalf("t0's second page: %+v", next)
	}
	var t1 billing.InvoicesAnswer
	if err := ask(t, t.Context(), e, subject.InvoicesQuery, "t1", nil, &t1); err != nil || len(t1.Invoices) != 1 || t1.Invoices[0].ID != "invoice:t1:2026-11-02T00:00:00Z" {
		t.Fatalf("t1's invoices: %+v %v", t1, err)
	}
	var none billing.InvoicesAnswer
	if err := ask(t, t.Context(), e, subject.InvoicesQuery, "t2", nil, &none); err != nil || len(none.Invoices) != 0 || none.Next != 0 {
		t.Fatalf("t2 has no invoice: %+v %v", none, err)
	}
	if after := e.consumerCount(t); after != before {
		t.Fatalf("BILLING has %d consumers after reading invoices, %d before: reading left some behind", after, before)
	}
}

func (e *env) consumerCount(t *testing.T) int {
	t.Helper()
	s, err := e.pub.JetStream().Stream(t.Context(), topology.StreamBilling)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}
