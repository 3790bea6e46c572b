// Package budget is a tenant's budget hard stop as the platform keeps it:
// the policy a budget has at 100 % of its amount, and the state a spend
// that reached it puts in force for the rest of the month. Metering writes
// one State per tenant in the BUDGETS bucket (budgetkv) when the tenant's
// month spend reaches its budget's amount under a policy that stops; every
// scheduler replica watches the bucket and rejects new rentals (and, under
// StopRunning, stops the running ones) while the State is in force. It
// imports neither NATS nor Redis.
package budget

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Policy is what happens when a tenant's month spend reaches its budget's
// amount.
type Policy string

// The policies.
const (
	// Alert only publishes the crossing (the default).
	Alert Policy = "alert"
	// RejectNew rejects the tenant's new rentals for the rest of the month.
	RejectNew Policy = "reject-new"
	// StopRunning rejects new rentals and stops the running ones once
	// their notice (the grace) passed.
	StopRunning Policy = "stop-running"
)

// DefaultGrace is how long a running rental runs after its notice under
// StopRunning when the budget names no grace.
const DefaultGrace = 5 * time.Minute

// MaxGrace bounds the grace a budget may give.
const MaxGrace = 24 * time.Hour

// ParsePolicy reads a policy; "" is Alert.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return Alert, nil
	case Alert, RejectNew, StopRunning:
		return p, nil
	}
	return "", fmt.Errorf("policy %q is not %s, %s or %s", s, Alert, RejectNew, StopRunning)
}

// Stops says whether the policy stops anything at 100 %.
func (p Policy) Stops() bool { return p == RejectNew || p == StopRunning }

// Proto is the policy as the BudgetThresholdCrossed event carries it.
func (p Policy) Proto() shizuv1.BudgetPolicy {
	switch p {
	case RejectNew:
		return shizuv1.BudgetPolicy_BUDGET_POLICY_REJECT_NEW
	case StopRunning:
		return shizuv1.BudgetPolicy_BUDGET_POLICY_STOP_RUNNING
	}
	return shizuv1.BudgetPolicy_BUDGET_POLICY_ALERT
}

// ParseGrace reads a budget's grace ("5m", "90s"); "" is DefaultGrace.
func ParseGrace(s string) (time.Duration, error) {
	if s == "" {
		return DefaultGrace, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("grace %q is not a duration (e.g. 5m)", s)
	}
	if d <= 0 || d > MaxGrace {
		return 0, fmt.Errorf("grace %s is out of range: more than 0s, at most %s", d, MaxGrace)
	}
	return d, nil
}

// Month is the calendar month (UTC) a spend at t counts in, as YYYY-MM.
func Month(t time.Time) string { return t.UTC().Format("2006-01") }

// State is a tenant's budget exhausted in a month under a policy that
// stops: the record of the BUDGETS bucket, keyed by tenant.
type State struct {
	Tenant string `json:"tenant"`
	Budget string `json:"budget"`
	// Month is the month (YYYY-MM, UTC) the spend is counted in; the
	// state is in force only during that month.
	Month string `json:"month"`
	// SpentMicros is the spend when the state was last written;
	// LimitMicros the budget's amount it reached.
	SpentMicros int64  `json:"spent_micros"`
	LimitMicros int64  `json:"limit_micros"`
	Currency    string `json:"currency"`
	Policy      Policy `json:"policy"`
	// GraceMillis is, under StopRunning, how long running rentals run
	// after ExhaustedAt before they are stopped.
	GraceMillis int64 `json:"grace_ms,omitempty"`
	// ExhaustedAt is when metering first saw the spend reach the limit
	// this month (kept by later writes of the same month and limit).
	ExhaustedAt time.Time `json:"exhausted_at"`
}

// Validate checks a state read from the bucket or about to be written.
func (s State) Validate() error {
	var errs []string
	if err := shizuv1.ValidToken(s.Tenant); err != nil {
		errs = append(errs, "tenant: "+err.Error())
	}
	if err := shizuv1.ValidToken(s.Budget); err != nil {
		errs = append(errs, "budget: "+err.Error())
	}
	if _, err := time.Parse("2006-01", s.Month); err != nil {
		errs = append(errs, fmt.Sprintf("month %q is not YYYY-MM", s.Month))
	}
	if s.LimitMicros <= 0 || s.SpentMicros < 0 {
		errs = append(errs, fmt.Sprintf("limit %d must be positive and spend %d not negative", s.LimitMicros, s.SpentMicros))
	}
	if s.Currency == "" {
		errs = append(errs, "currency: missing")
	}
	if !s.Policy.Stops() {
		errs = append(errs, fmt.Sprintf("policy %q stops nothing (want %s or %s)", s.Policy, RejectNew, StopRunning))
	}
	if s.GraceMillis < 0 {
		errs = append(errs, fmt.Sprintf("grace %d ms is negative", s.GraceMillis))
	}
	if s.ExhaustedAt.IsZero() {
		errs = append(errs, "exhausted_at: missing")
	}
	if len(errs) > 0 {
		return fmt.Errorf("budget state of %q: %s", s.Tenant, strings.Join(errs, "; "))
	}
	return nil
}

// Grace is the grace of a StopRunning state.
func (s State) Grace() time.Duration { return time.Duration(s.GraceMillis) * time.Millisecond }

// InForce says whether the state blocks the tenant's new rentals at now:
// its policy stops, its month is now's, and the spend reached the limit.
func (s State) InForce(now time.Time) bool {
	return s.Policy.Stops() && s.Month == Month(now) && s.SpentMicros >= s.LimitMicros
}

// StopsRunning says whether, at now, the tenant's running rentals are to
// be given notice and stopped.
func (s State) StopsRunning(now time.Time) bool { return s.Policy == StopRunning && s.InForce(now) }

// StopAt is when the running rentals of a StopRunning state are stopped:
// ExhaustedAt plus the grace, the same instant on every replica.
func (s State) StopAt() time.Time { return s.ExhaustedAt.Add(s.Grace()) }

// Refusal is the message a rejected request of the tenant carries.
func (s State) Refusal() string {
	return fmt.Sprintf("the %s budget of tenant %s is spent for %s: %s of %s; new rentals are refused until the budget is raised or the month ends",
		s.Budget, s.Tenant, s.Month, Amount(s.SpentMicros, s.Currency), Amount(s.LimitMicros, s.Currency))
}

// Notice is the message of a running rental's notice under StopRunning.
func (s State) Notice() string {
	return fmt.Sprintf("the %s budget of tenant %s is spent for %s (%s of %s): this rental will be stopped at %s",
		s.Budget, s.Tenant, s.Month, Amount(s.SpentMicros, s.Currency), Amount(s.LimitMicros, s.Currency),
		s.StopAt().UTC().Format(time.RFC3339))
}

// Amount writes micro-units of a currency for people: "12.50 USD",
// "0.000001 USD" (at least two decimals, at most six).
func Amount(micros int64, currency string) string {
	sign := ""
	if micros < 0 {
		sign, micros = "-", -micros
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", micros%1_000_000), "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return sign + strconv.FormatInt(micros/1_000_000, 10) + "." + frac + " " + currency
}
