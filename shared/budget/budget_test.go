package budget_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/budget"
)

func TestPoliciesAndGracesAreReadOrRefusedByName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]budget.Policy{"": budget.Alert, "alert": budget.Alert, "reject-new": budget.RejectNew, "stop-running": budget.StopRunning} {
		if got, err := budget.ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := budget.ParsePolicy("stop"); err == nil || !strings.Contains(err.Error(), `policy "stop" is not alert, reject-new or stop-running`) {
		t.Errorf("ParsePolicy(stop): %v", err)
	}
	if d, err := budget.ParseGrace(""); err != nil || d != budget.DefaultGrace {
		t.Errorf("ParseGrace(\"\") = %s, %v; want the default", d, err)
	}
	for in, want := range map[string]string{"soon": `grace "soon" is not a duration (e.g. 5m)`, "0s": "grace 0s is out of range", "25h": "grace 25h0m0s is out of range"} {
		if _, err := budget.ParseGrace(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseGrace(%q): %v, want %q", in, err, want)
		}
	}
}

func exhausted(policy budget.Policy) budget.State {
	return budget.State{Tenant: "acme", Budget: "monthly", Month: "2026-12", SpentMicros: 1_000_500_000, LimitMicros: 1_000_000_000,
		Currency: "USD", Policy: policy, GraceMillis: 300_000, ExhaustedAt: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)}
}

func TestAStateIsInForceOnlyInItsMonthAndUnderAPolicyThatStops(t *testing.T) {
	t.Parallel()
	in := time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC)
	next := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name         string
		st           budget.State
		at           time.Time
		force, stops bool
	}{
		{"reject-new blocks new rentals in its month", exhausted(budget.RejectNew), in, true, false},
		{"stop-running blocks and stops in its month", exhausted(budget.StopRunning), in, true, true},
		{"a new month lifts it", exhausted(budget.StopRunning), next, false, false},
		{"alert stops nothing", exhausted(budget.Alert), in, false, false},
		{"a spend below the limit stops nothing", func() budget.State { s := exhausted(budget.RejectNew); s.SpentMicros = 1; return s }(), in, false, false},
	}
	for _, c := range cases {
		if got := c.st.InForce(c.at); got != c.force {
			t.Errorf("%s: InForce = %v", c.name, got)
		}
		if got := c.st.StopsRunning(c.at); got != c.stops {
			t.Errorf("%s: StopsRunning = %v", c.name, got)
		}
	}
	st := exhausted(budget.StopRunning)
	if want := st.ExhaustedAt.Add(5 * time.Minute); !st.StopAt().Equal(want) {
		t.Errorf("StopAt = %s, want %s", st.StopAt(), want)
	}
}

func TestMessagesNameTheBudgetAndTheSpendInPeoplesWords(t *testing.T) {
	t.Parallel()
	st := exhausted(budget.StopRunning)
	want := "the monthly budget of tenant acme is spent for 2026-12: 1000.50 USD of 1000.00 USD; new rentals are refused until the budget is raised or the month ends"
	if got := st.Refusal(); got != want {
		t.Errorf("Refusal = %q\nwant      %q", got, want)
	}
	if got := st.Notice(); !strings.Contains(got, "will be stopped at 2026-12-04T10:05:00Z") || !strings.Contains(got, "1000.50 USD of 1000.00 USD") {
		t.Errorf("Notice = %q", got)
	}
	for micros, want := range map[int64]string{0: "0.00 USD", 1: "0.000001 USD", 12_500_000: "12.50 USD", 1_234_567: "1.234567 USD"} {
		if got := budget.Amount(micros, "USD"); got != want {
			t.Errorf("Amount(%d) = %q, want %q", micros, got, want)
		}
	}
}

func TestAStateThatStopsNothingOrLacksFieldsIsInvalid(t *testing.T) {
	t.Parallel()
	if err := exhausted(budget.RejectNew).Validate(); err != nil {
		t.Fatal(err)
	}
	bad := exhausted(budget.Alert)
	bad.Month, bad.ExhaustedAt = "December", time.Time{}
	err := bad.Validate()
	for _, want := range []string{`month "December" is not YYYY-MM`, `policy "alert" stops nothing`, "exhausted_at: missing"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %q", err, want)
		}
	}
}
