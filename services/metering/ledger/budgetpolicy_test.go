package ledger_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/budget"
)

func TestABudgetsPolicyIsValidatedWithClearErrors(t *testing.T) {
	t.Parallel()
	cat, err := pricing.Shipped()
	if err != nil {
		t.Fatal(err)
	}
	valid := ledger.Budget{TenantID: "acme", Currency: cat.Currency, AmountMicros: 1_000_000, Policy: budget.StopRunning, Grace: "90s"}
	if err := (ledger.Accounts{Budgets: []ledger.Budget{valid}}).Validate(cat); err != nil {
		t.Fatalf("a stop-running budget with an amount and a grace (and no other threshold) is refused: %v", err)
	}
	cases := []struct {
		name string
		edit func(*ledger.Budget)
		want string
	}{
		{"an unknown policy is refused", func(b *ledger.Budget) { b.Policy = "halt" },
			`budgets[0]: policy "halt" is not alert, reject-new or stop-running`},
		{"a policy that stops needs an amount", func(b *ledger.Budget) { b.AmountMicros, b.ThresholdsMicros = 0, []int64{5} },
			"budgets[0]: policy stop-running acts at 100 % of amount_micros: set a positive amount_micros"},
		{"a grace under another policy is refused", func(b *ledger.Budget) { b.Policy = budget.RejectNew },
			`budgets[0]: grace "90s" is for policy stop-running only (this budget's policy is reject-new)`},
		{"a grace that is no duration is refused", func(b *ledger.Budget) { b.Grace = "a while" },
			`budgets[0]: grace "a while" is not a duration (e.g. 5m)`},
		{"a negative grace is refused", func(b *ledger.Budget) { b.Grace = "-1m" },
			"budgets[0]: grace -1m0s is out of range"},
		{"an alert budget still needs a threshold", func(b *ledger.Budget) { b.Policy, b.Grace = budget.Alert, "" },
			"budgets[0]: no thresholds_micros nor thresholds_percent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := valid
			c.edit(&b)
			err := (ledger.Accounts{Budgets: []ledger.Budget{b}}).Validate(cat)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

func TestAPolicyThatStopsAddsTheHundredPercentThreshold(t *testing.T) {
	t.Parallel()
	alert := ledger.Budget{TenantID: "acme", Currency: "USD", AmountMicros: 1000, ThresholdsPercent: []int32{50}}
	if got := alert.Thresholds(); !slices.Equal(got, []ledger.Threshold{{Micros: 500, Percent: 50}}) {
		t.Fatalf("alert budget thresholds %v", got)
	}
	stop := alert
	stop.Policy = budget.RejectNew
	want := []ledger.Threshold{{Micros: 500, Percent: 50}, {Micros: 1000, Percent: 100}}
	if got := stop.Thresholds(); !slices.Equal(got, want) {
		t.Fatalf("reject-new thresholds %v, want %v", got, want)
	}
	if stop.Exhausts(want[0]) || !stop.Exhausts(want[1]) || alert.Exhausts(want[1]) {
		t.Fatal("only the 100 % threshold of a policy that stops exhausts a budget")
	}
	// Listing 100 % as well changes nothing.
	stop.ThresholdsPercent = []int32{50, 100}
	if got := stop.Thresholds(); !slices.Equal(got, want) {
		t.Fatalf("thresholds with 100 %% listed %v", got)
	}
}

func TestTheExhaustingCrossingCarriesThePolicyAndGrace(t *testing.T) {
	t.Parallel()
	b := ledger.Budget{TenantID: "acme", Currency: "USD", AmountMicros: 1000, Policy: budget.StopRunning, Grace: "2m"}
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	now := start.Add(72 * time.Hour)
	ev := ledger.BudgetCrossed(b, ledger.Threshold{Micros: 1000, Percent: 100}, start, 1010, now, "metering")
	if err := ev.Validate(); err != nil {
		t.Fatal(err)
	}
	if ev.GetPolicy() != shizuv1.BudgetPolicy_BUDGET_POLICY_STOP_RUNNING || ev.GetGrace().AsDuration() != 2*time.Minute || !ev.GetExhausted() {
		t.Fatalf("crossing %v", ev)
	}
	st := b.Exhausted("2026-12", 1010, now)
	if err := st.Validate(); err != nil || st.Grace() != 2*time.Minute || !st.StopsRunning(now) || st.Budget != "monthly" {
		t.Fatalf("state %+v (%v)", st, err)
	}
	// The default grace; reject-new has none.
	b.Grace = ""
	if b.GraceOf() != budget.DefaultGrace {
		t.Fatalf("default grace %s", b.GraceOf())
	}
	b.Policy = budget.RejectNew
	if ev := ledger.BudgetCrossed(b, ledger.Threshold{Micros: 1000, Percent: 100}, start, 1010, now, "metering"); ev.GetGrace() != nil || ev.Validate() != nil {
		t.Fatalf("reject-new crossing %v (%v)", ev, ev.Validate())
	}
}
