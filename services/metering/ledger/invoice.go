package ledger

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/budget"
)

// Commitment is a tenant's reserved commitment: GPUCount GPUs of Model for a
// month or a year from Start, at a discount off list (0 means the
// catalogue's discount for the term).
type Commitment struct {
	TenantID        string       `json:"tenant_id"`
	Model           string       `json:"model"`
	GPUCount        int32        `json:"gpu_count"`
	Term            pricing.Term `json:"term"`
	Start           time.Time    `json:"start"`
	DiscountPercent int64        `json:"discount_percent,omitempty"`
}

// End is when the commitment's term ends (exclusive).
func (c Commitment) End() time.Time {
	if c.Term == pricing.TermYear {
		return c.Start.AddDate(1, 0, 0)
	}
	return c.Start.AddDate(0, 1, 0)
}

// Validate checks c against the catalogue.
func (c Commitment) Validate(cat *pricing.Catalogue) error {
	var errs []error
	if err := shizuv1.ValidToken(c.TenantID); err != nil {
		errs = append(errs, fmt.Errorf("tenant_id: %w", err))
	}
	if c.GPUCount < 1 || c.GPUCount > shizuv1.MaxGPUCount*1024 {
		errs = append(errs, fmt.Errorf("gpu_count: %d must be at least 1", c.GPUCount))
	}
	if c.Start.IsZero() {
		errs = append(errs, errors.New("start: missing"))
	}
	if _, err := cat.Reserved(c.Model, c.Term, c.DiscountPercent); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Rate is the reserved price per GPU-hour of c.
func (c Commitment) Rate(cat *pricing.Catalogue) (pricing.Money, error) {
	return cat.Reserved(c.Model, c.Term, c.DiscountPercent)
}

// committed is c's quantity inside [from, to) in milli-GPU-seconds.
func (c Commitment) committed(from, to time.Time) int64 {
	s, e := c.Start, c.End()
	if from.After(s) {
		s = from
	}
	if to.Before(e) {
		e = to
	}
	if !e.After(s) {
		return 0
	}
	return int64(c.GPUCount) * shizuv1.MilliGPUWhole * int64(e.Sub(s)/time.Second)
}

// Usage is the sum of a tenant's usage records of one plan and model.
type Usage struct {
	Plan            shizuv1.Plan
	Model           string
	MilliGPUSeconds int64
	// Amount is the sum of the records' amounts.
	Amount pricing.Money
}

// Line is one invoice line.
type Line struct {
	Plan            shizuv1.Plan
	Model           string
	MilliGPUSeconds int64
	Amount          pricing.Money
}

// Invoice is a tenant's bill for a period.
type Invoice struct {
	ID          string
	TenantID    string
	PeriodStart time.Time
	PeriodEnd   time.Time
	Lines       []Line
	Total       pricing.Money
}

// InvoiceID is the deterministic id of a tenant's invoice for the period
// starting at start.
func InvoiceID(tenantID string, start time.Time) string {
	return "invoice:" + tenantID + ":" + start.UTC().Format(time.RFC3339Nano)
}

// BuildInvoice prices a tenant's period.
//
// On-demand and spot lines are the sums of their usage records. Reserved
// usage is settled against the tenant's commitments for the model over the
// period: the whole committed quantity (GPUs × seconds of the commitment
// inside the period) is owed at the reserved rate whether used or not, and
// reserved usage beyond it is billed at the on-demand list price on the
// model's on-demand line. Each settled amount is rounded half up once.
func BuildInvoice(cat *pricing.Catalogue, tenantID string, periodStart, periodEnd time.Time, usage []Usage, commitments []Commitment) (Invoice, error) {
	if !periodEnd.After(periodStart) {
		return Invoice{}, fmt.Errorf("period end %s is not after its start %s", periodEnd.Format(time.RFC3339), periodStart.Format(time.RFC3339))
	}
	type key struct {
		plan  shizuv1.Plan
		model string
	}
	lines := map[key]*Line{}
	line := func(plan shizuv1.Plan, model string) *Line {
		k := key{plan, model}
		if l, ok := lines[k]; ok {
			return l
		}
		l := &Line{Plan: plan, Model: model, Amount: pricing.Money{Currency: cat.Currency}}
		lines[k] = l
		return l
	}
	reservedUsed := map[string]int64{}
	for _, u := range usage {
		if _, err := cat.Type(u.Model); err != nil {
			return Invoice{}, err
		}
		if u.MilliGPUSeconds < 0 || u.Amount.Micros < 0 {
			return Invoice{}, fmt.Errorf("usage %s/%s: negative quantity or amount", u.Plan, u.Model)
		}
		if u.Amount.Currency != "" && u.Amount.Currency != cat.Currency {
			return Invoice{}, fmt.Errorf("usage %s/%s is in %s, the catalogue in %s", u.Plan, u.Model, u.Amount.Currency, cat.Currency)
		}
		switch u.Plan {
		case shizuv1.Plan_PLAN_RESERVED:
			reservedUsed[u.Model] += u.MilliGPUSeconds
		case shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.Plan_PLAN_SPOT:
			l := line(u.Plan, u.Model)
			l.MilliGPUSeconds += u.MilliGPUSeconds
			l.Amount.Micros += u.Amount.Micros
		default:
			return Invoice{}, fmt.Errorf("usage plan %s is not billable", u.Plan)
		}
	}
	committed := map[string]int64{}
	owed := map[string]*accrual{}
	for _, c := range commitments {
		if c.TenantID != tenantID {
			continue
		}
		if err := c.Validate(cat); err != nil {
			return Invoice{}, fmt.Errorf("commitment %s %s from %s: %w", c.Model, c.Term, c.Start.Format(time.RFC3339), err)
		}
		q := c.committed(periodStart, periodEnd)
		if q == 0 {
			continue
		}
		rate, _ := c.Rate(cat)
		if owed[c.Model] == nil {
			owed[c.Model] = &accrual{}
		}
		owed[c.Model].add(uint64(rate.Micros), uint64(q))
		committed[c.Model] += q
	}
	models := map[string]bool{}
	for m := range committed {
		models[m] = true
	}
	for m := range reservedUsed {
		models[m] = true
	}
	for m := range models {
		if q := committed[m]; q > 0 {
			l := line(shizuv1.Plan_PLAN_RESERVED, m)
			l.MilliGPUSeconds += q
			l.Amount.Micros += owed[m].micros()
		}
		if over := reservedUsed[m] - committed[m]; over > 0 {
			od, err := cat.OnDemand(m)
			if err != nil {
				return Invoice{}, err
			}
			var a accrual
			a.add(uint64(od.Micros), uint64(over))
			l := line(shizuv1.Plan_PLAN_ON_DEMAND, m)
			l.MilliGPUSeconds += over
			l.Amount.Micros += a.micros()
		}
	}
	inv := Invoice{ID: InvoiceID(tenantID, periodStart), TenantID: tenantID, PeriodStart: periodStart.UTC(),
		PeriodEnd: periodEnd.UTC(), Total: pricing.Money{Currency: cat.Currency}}
	for _, l := range lines {
		inv.Lines = append(inv.Lines, *l)
		inv.Total.Micros += l.Amount.Micros
	}
	sort.Slice(inv.Lines, func(i, j int) bool {
		if inv.Lines[i].Plan != inv.Lines[j].Plan {
			return inv.Lines[i].Plan < inv.Lines[j].Plan
		}
		return inv.Lines[i].Model < inv.Lines[j].Model
	})
	return inv, nil
}

// Budget is a tenant's spending thresholds for a calendar month: absolute
// spends, or percentages of an amount, or both.
type Budget struct {
	// ID names the budget in the alerts (default "monthly").
	ID       string `json:"id,omitempty"`
	TenantID string `json:"tenant_id"`
	Currency string `json:"currency"`
	// ThresholdsMicros are the spends to be alerted at.
	ThresholdsMicros []int64 `json:"thresholds_micros,omitempty"`
	// AmountMicros is the month's budget; ThresholdsPercent are alerted at
	// that percentage of it (rounded down to the micro-unit).
	AmountMicros      int64   `json:"amount_micros,omitempty"`
	ThresholdsPercent []int32 `json:"thresholds_percent,omitempty"`
	// Policy is what happens when the month's spend reaches AmountMicros
	// (100 %): alert (the default: only the crossing is published),
	// reject-new (the tenant's new rentals are rejected for the rest of
	// the month) or stop-running (reject-new, and running rentals get a
	// notice and are stopped once Grace passed). A policy that stops
	// needs an AmountMicros, and adds the 100 % threshold.
	Policy budget.Policy `json:"policy,omitempty"`
	// Grace is, under stop-running, how long running rentals run after
	// their notice ("5m", "90s"); empty means budget.DefaultGrace.
	Grace string `json:"grace,omitempty"`
}

// DefaultBudgetID is the ID of a budget that names none.
const DefaultBudgetID = "monthly"

// Name is the budget's ID, or DefaultBudgetID.
func (b Budget) Name() string {
	if b.ID == "" {
		return DefaultBudgetID
	}
	return b.ID
}

// Threshold is one spend a budget alerts at; Percent is 0 for an absolute
// threshold.
type Threshold struct {
	Micros  int64
	Percent int32
}

// Thresholds are the budget's thresholds in ascending order of spend; of
// an absolute and a percentage threshold at the same spend, the percentage
// is kept.
func (b Budget) Thresholds() []Threshold {
	byMicros := map[int64]Threshold{}
	for _, t := range b.ThresholdsMicros {
		if _, ok := byMicros[t]; !ok {
			byMicros[t] = Threshold{Micros: t}
		}
	}
	percents := b.ThresholdsPercent
	if b.Policy.Stops() {
		percents = append(slices.Clone(percents), 100) // the hard stop
	}
	for _, p := range percents {
		t := b.AmountMicros/100*int64(p) + b.AmountMicros%100*int64(p)/100
		byMicros[t] = Threshold{Micros: t, Percent: p}
	}
	out := make([]Threshold, 0, len(byMicros))
	for _, t := range byMicros {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Micros < out[j].Micros })
	return out
}

// Reached returns the thresholds a spend has reached, in ascending order.
func (b Budget) Reached(spent int64) []Threshold {
	var out []Threshold
	for _, t := range b.Thresholds() {
		if t.Micros > 0 && t.Micros <= spent {
			out = append(out, t)
		}
	}
	return out
}

// Exhausts says whether reaching t exhausts the budget: t is its amount
// (100 %) and its policy stops.
func (b Budget) Exhausts(t Threshold) bool {
	return b.Policy.Stops() && b.AmountMicros > 0 && t.Micros == b.AmountMicros
}

// GraceOf is the budget's grace under stop-running (0 under another
// policy); a grace that does not parse (Validate refuses it) is the
// default.
func (b Budget) GraceOf() time.Duration {
	if b.Policy != budget.StopRunning {
		return 0
	}
	d, err := budget.ParseGrace(b.Grace)
	if err != nil {
		return budget.DefaultGrace
	}
	return d
}

// Exhausted is the state the budget's exhaustion in month (YYYY-MM) puts
// in force, first seen at now with spent.
func (b Budget) Exhausted(month string, spent int64, now time.Time) budget.State {
	return budget.State{Tenant: b.TenantID, Budget: b.Name(), Month: month, SpentMicros: spent, LimitMicros: b.AmountMicros,
		Currency: b.Currency, Policy: b.Policy, GraceMillis: b.GraceOf().Milliseconds(), ExhaustedAt: now.UTC()}
}
