package ledger_test

import (
	"slices"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/fault"
)

func TestDueAlertsAreTheReachedThresholdsNotAlertedYet(t *testing.T) {
	t.Parallel()
	b := ledger.Budget{TenantID: "acme", Currency: "USD", AmountMicros: 1000, ThresholdsPercent: []int32{50},
		ThresholdsMicros: []int64{100, 200}}
	cases := []struct {
		name    string
		spent   int64
		alerted []int64
		want    []ledger.Threshold
	}{
		{"a spend below every threshold alerts nothing", 99, nil, nil},
		{"a spend on a threshold reaches it", 100, nil, []ledger.Threshold{{Micros: 100}}},
		{"a jump over several thresholds alerts each, in ascending order", 600, nil,
			[]ledger.Threshold{{Micros: 100}, {Micros: 200}, {Micros: 500, Percent: 50}}},
		{"an alerted threshold is not alerted again", 600, []int64{100, 500}, []ledger.Threshold{{Micros: 200}}},
		{"everything alerted: nothing is due", 10_000, []int64{100, 200, 500}, nil},
		{"a threshold alerted but not reached yet changes nothing", 150, []int64{200}, []ledger.Threshold{{Micros: 100}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.DueAlerts(b, tc.spent, tc.alerted); !slices.Equal(got, tc.want) {
				t.Fatalf("due %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTheBudgetCrossingEventHasADeterministicIDAndValidates(t *testing.T) {
	t.Parallel()
	b := ledger.Budget{TenantID: "acme", Currency: "USD", AmountMicros: 1000, ThresholdsPercent: []int32{80}}
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	now := start.Add(36 * time.Hour)
	ev := ledger.BudgetCrossed(b, ledger.Threshold{Micros: 800, Percent: 80}, start, 812, now, "metering")
	if err := ev.Validate(); err != nil {
		t.Fatalf("event does not validate: %v", err)
	}
	if id := ev.GetMeta().GetEventId(); id != "budget:acme:monthly:2026-11:800" {
		t.Fatalf("event id %q is not the documented scheme", id)
	}
	if ev.GetBudgetAmount().GetMicros() != 1000 || !ev.GetPeriodEnd().AsTime().Equal(start.AddDate(0, 1, 0)) ||
		!ev.GetMeta().GetOccurredAt().AsTime().Equal(now) || ev.GetMeta().GetCorrelationId() != "acme" {
		t.Fatalf("event %v", ev)
	}
	if abs := ledger.BudgetCrossed(b, ledger.Threshold{Micros: 800}, start, 812, now, "metering"); abs.GetBudgetAmount() != nil {
		t.Fatalf("an absolute threshold's crossing names the budget amount: %v", abs)
	}
}

func TestTheCommitmentInForceIsTheEarliestStartedOfTheTenantAndModel(t *testing.T) {
	t.Parallel()
	nov, dec := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	acc := ledger.Accounts{Commitments: []ledger.Commitment{
		{TenantID: "acme", Model: "H100-SXM5-80GB", GPUCount: 1, Term: pricing.TermYear, Start: nov.AddDate(0, 0, 10)},
		{TenantID: "acme", Model: "H100-SXM5-80GB", GPUCount: 2, Term: pricing.TermMonth, Start: nov},
		{TenantID: "acme", Model: "A100-SXM4-80GB", GPUCount: 3, Term: pricing.TermMonth, Start: nov},
		{TenantID: "other", Model: "H100-SXM5-80GB", GPUCount: 4, Term: pricing.TermMonth, Start: nov},
	}}
	cases := []struct {
		name          string
		tenant, model string
		at            time.Time
		wantGPUs      int32 // 0: none in force
	}{
		{"before any commitment starts there is none", "acme", "H100-SXM5-80GB", nov.Add(-time.Second), 0},
		{"at its start the commitment is in force", "acme", "H100-SXM5-80GB", nov, 2},
		{"of two in force the earlier started wins", "acme", "H100-SXM5-80GB", nov.AddDate(0, 0, 15), 2},
		{"at its end a month's commitment is over", "acme", "H100-SXM5-80GB", dec, 1},
		{"another model's commitment does not count", "acme", "L4", nov, 0},
		{"another tenant's commitment does not count", "nobody", "H100-SXM5-80GB", nov, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, ok := acc.Commitment(tc.tenant, tc.model, tc.at)
			if got := map[bool]int32{true: c.GPUCount}[ok]; got != tc.wantGPUs {
				t.Fatalf("commitment of %d GPUs (found %v), want %d", c.GPUCount, ok, tc.wantGPUs)
			}
		})
	}
	if b, ok := (ledger.Accounts{Budgets: []ledger.Budget{{TenantID: "x"}, {TenantID: "acme", ID: "q"}}}).Budget("acme"); !ok || b.ID != "q" {
		t.Fatalf("budget of acme: %+v %v", b, ok)
	}
}

func TestTheTariffFollowsThePlan(t *testing.T) {
	t.Parallel()
	cat := catalogue(t)
	nov := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	acc := ledger.Accounts{Commitments: []ledger.Commitment{{TenantID: "acme", Model: "H100-SXM5-80GB", GPUCount: 1, Term: pricing.TermMonth, Start: nov}}}
	history := []ledger.PricePoint{{At: nov, Price: usd(900_000)}}
	reserved, _ := cat.Reserved("H100-SXM5-80GB", pricing.TermMonth, 0)
	spotDefault, _ := cat.SpotDefault("H100-SXM5-80GB")
	seg := func(plan shizuv1.Plan, tenant string, start time.Time) ledger.Segment {
		s := segment()
		s.Plan, s.TenantID, s.Start = plan, tenant, start
		return s
	}
	cases := []struct {
		name     string
		seg      ledger.Segment
		wantBase pricing.Money
		wantSpot int
	}{
		{"on demand is the list price", seg(shizuv1.Plan_PLAN_ON_DEMAND, "acme", nov), usd(2_500_000), 0},
		{"reserved inside a commitment is its rate", seg(shizuv1.Plan_PLAN_RESERVED, "acme", nov.Add(time.Hour)), reserved, 0},
		{"reserved without a commitment is the list price", seg(shizuv1.Plan_PLAN_RESERVED, "other", nov), usd(2_500_000), 0},
		{"reserved started before the commitment is the list price", seg(shizuv1.Plan_PLAN_RESERVED, "acme", nov.Add(-time.Hour)), usd(2_500_000), 0},
		{"spot is the market history over the spot default", seg(shizuv1.Plan_PLAN_SPOT, "acme", nov), spotDefault, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var spot []ledger.PricePoint
			if ledger.NeedsSpotHistory(tc.seg) {
				spot = history
			}
			got, err := ledger.TariffOf(cat, acc, tc.seg, spot)
			if err != nil || got.Base != tc.wantBase || len(got.Spot) != tc.wantSpot {
				t.Fatalf("tariff %+v (%v), want base %s and %d spot prices", got, err, tc.wantBase, tc.wantSpot)
			}
		})
	}
	unknown := segment()
	unknown.Model = "TPU"
	if _, err := ledger.TariffOf(cat, acc, unknown, nil); !fault.IsInvalid(err) {
		t.Fatalf("a model the catalogue does not know: %v, want an invalid-input error", err)
	}
}
