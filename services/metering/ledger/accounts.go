package ledger

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/budget"
)

// Accounts are the tenants' reserved commitments and budgets.
type Accounts struct {
	Commitments []Commitment `json:"commitments"`
	Budgets     []Budget     `json:"budgets"`
}

// Budget is the tenant's budget, if it has one.
func (a Accounts) Budget(tenant string) (Budget, bool) {
	for _, b := range a.Budgets {
		if b.TenantID == tenant {
			return b, true
		}
	}
	return Budget{}, false
}

// Commitment is the tenant's earliest-started commitment for model in
// force at t.
func (a Accounts) Commitment(tenant, model string, t time.Time) (Commitment, bool) {
	var found []Commitment
	for _, c := range a.Commitments {
		if c.TenantID == tenant && c.Model == model && !t.Before(c.Start) && t.Before(c.End()) {
			found = append(found, c)
		}
	}
	if len(found) == 0 {
		return Commitment{}, false
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Start.Before(found[j].Start) })
	return found[0], true
}

// Validate checks every commitment and budget against the catalogue.
func (a Accounts) Validate(cat *pricing.Catalogue) error {
	var errs []error
	for i, c := range a.Commitments {
		if err := c.Validate(cat); err != nil {
			errs = append(errs, fmt.Errorf("commitments[%d]: %w", i, err))
		}
	}
	tenants := map[string]bool{}
	for i, b := range a.Budgets {
		if tenants[b.TenantID] {
			errs = append(errs, fmt.Errorf("budgets[%d]: tenant %s has a budget already", i, b.TenantID))
		}
		tenants[b.TenantID] = true
		errs = append(errs, b.validate(i, cat.Currency)...)
	}
	return errors.Join(errs...)
}

func (b Budget) validate(i int, currency string) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("budgets[%d]: "+format, append([]any{i}, args...)...))
	}
	if b.TenantID == "" || b.Currency != currency {
		add("needs a tenant_id and the catalogue's currency %s", currency)
	}
	if err := shizuv1.ValidToken(b.Name()); err != nil {
		add("id: %w", err)
	}
	if len(b.ThresholdsMicros)+len(b.ThresholdsPercent) == 0 && !b.Policy.Stops() {
		add("no thresholds_micros nor thresholds_percent (nor a policy that stops at 100 %%)")
	}
	for _, t := range b.ThresholdsMicros {
		if t <= 0 {
			add("threshold %d must be positive", t)
		}
	}
	if b.AmountMicros < 0 || b.AmountMicros > math.MaxInt64/1000 {
		add("amount_micros %d is out of range 0..%d", b.AmountMicros, int64(math.MaxInt64/1000))
	}
	if len(b.ThresholdsPercent) > 0 && b.AmountMicros <= 0 {
		add("thresholds_percent need a positive amount_micros")
	}
	for _, p := range b.ThresholdsPercent {
		if p < 1 || p > 1000 {
			add("threshold %d %% is out of range 1..1000", p)
		}
	}
	policy, err := budget.ParsePolicy(string(b.Policy))
	if err != nil {
		add("%w", err)
	}
	if policy.Stops() && b.AmountMicros <= 0 {
		add("policy %s acts at 100 %% of amount_micros: set a positive amount_micros", policy)
	}
	if b.Grace != "" {
		if policy != budget.StopRunning {
			add("grace %q is for policy %s only (this budget's policy is %s)", b.Grace, budget.StopRunning, policy)
		} else if _, err := budget.ParseGrace(b.Grace); err != nil {
			add("%w", err)
		}
	}
	return errs
}

// DueAlerts are the thresholds of budget that a spend of spent in a month
// has reached and that have not been alerted yet (alerted lists the
// thresholds' micros already alerted that month), in ascending order. It
// looks at the spend, not at the record that moved it, so a crossing whose
// alert failed is due again on the redelivery.
func DueAlerts(budget Budget, spent int64, alerted []int64) []Threshold {
	var due []Threshold
	for _, t := range budget.Reached(spent) {
		if !slices.Contains(alerted, t.Micros) {
			due = append(due, t)
		}
	}
	return due
}

// Month is the calendar month (UTC) a budget counts t in, as YYYY-MM.
func Month(t time.Time) string { return t.UTC().Format("2006-01") }

// BudgetCrossed is the event of budget's threshold t reached by spent in
// the month starting at start, emitted by source at now. Its id is
// deterministic (budget:<tenant>:<budget>:<YYYY-MM>:<threshold micros>): two
// replicas, or a crash between publishing and marking it alerted, publish
// it again under the same id, which the stream stores once.
func BudgetCrossed(b Budget, t Threshold, start time.Time, spent int64, now time.Time, source string) *shizuv1.BudgetThresholdCrossed {
	id := "budget:" + b.TenantID + ":" + b.Name() + ":" + start.Format("2006-01") + ":" + strconv.FormatInt(t.Micros, 10)
	ev := &shizuv1.BudgetThresholdCrossed{
		Meta:     shizuv1.NewMeta(id, source, "", b.TenantID, now),
		TenantId: b.TenantID, BudgetId: b.Name(),
		PeriodStart: timestamppb.New(start), PeriodEnd: timestamppb.New(start.AddDate(0, 1, 0)),
		Threshold:        &shizuv1.Money{Micros: t.Micros, Currency: b.Currency},
		ThresholdPercent: t.Percent,
		Spent:            &shizuv1.Money{Micros: spent, Currency: b.Currency},
	}
	if t.Percent != 0 {
		ev.BudgetAmount = &shizuv1.Money{Micros: b.AmountMicros, Currency: b.Currency}
	}
	if b.Policy != "" {
		ev.Policy = b.Policy.Proto()
	}
	if g := b.GraceOf(); g > 0 {
		ev.Grace = durationpb.New(g)
	}
	ev.Exhausted = b.Exhausts(t)
	return ev
}
