package app

import (
	"context"
	"fmt"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// HandleUsage folds a batch of usage records into the aggregates (the
// BILLING consumer's handler: one store call for the batch, each record
// once per record id) and then alerts the budgets of the tenants they
// belong to. It returns one error per delivery.
func (m *Meter) HandleUsage(ctx context.Context, ds []bus.Delivery) []error {
	out := make([]error, len(ds))
	recs := make([]*shizuv1.UsageRecorded, 0, len(ds))
	idx := make([]int, 0, len(ds))
	for i, d := range ds {
		if d.Event != eventUsage {
			out[i] = bus.Unhandled(d)
			continue
		}
		ev := &shizuv1.UsageRecorded{}
		if out[i] = decode(d, ev); out[i] == nil {
			recs, idx = append(recs, ev), append(idx, i)
		}
	}
	applied, err := m.store.ApplyAll(ctx, "", recs)
	if err != nil {
		m.noteLost(err)
		for _, i := range idx {
			out[i] = err
		}
		return out
	}
	var fresh int64
	type period struct{ tenant, month string }
	spends := map[period]int64{}
	recordsOf := map[period][]int{}
	for j, a := range applied {
		if a.New {
			fresh++
		}
		ev := recs[j]
		if b, ok := m.accounts.Budget(ev.GetTenantId()); !ok || b.Currency != ev.GetAmount().GetCurrency() {
			continue
		}
		k := period{ev.GetTenantId(), ledger.Month(ev.GetIntervalStart().AsTime())}
		spends[k] = max(spends[k], a.MonthAfter)
		recordsOf[k] = append(recordsOf[k], idx[j])
	}
	m.metrics.applied.Add(ctx, fresh)
	m.metrics.duplicates.Add(ctx, int64(len(applied))-fresh)
	for k, spent := range spends {
		budget, _ := m.accounts.Budget(k.tenant)
		if err := m.alertBudget(ctx, budget, k.month, spent); err != nil {
			for _, i := range recordsOf[k] {
				out[i] = err
			}
		}
	}
	return out
}

// alertBudget publishes a BudgetThresholdCrossed for every threshold due
// (ledger.DueAlerts: reached by the tenant's spend in month and not
// alerted yet), then marks them alerted. A crossing whose alert failed is
// alerted on the redelivery; one published twice (two replicas, a crash
// between publishing and marking) has the same id, which the stream
// stores once.
func (m *Meter) alertBudget(ctx context.Context, budget ledger.Budget, month string, spent int64) error {
	if len(budget.Reached(spent)) == 0 {
		return nil
	}
	done, err := m.store.Alerts(ctx, budget.TenantID, month)
	if err != nil {
		return err
	}
	todo := ledger.DueAlerts(budget, spent, done)
	if len(todo) == 0 {
		return nil
	}
	start, err := time.Parse("2006-01", month)
	if err != nil {
		return err
	}
	subj, err := subject.Format(subject.UsageBudgetCrossed, budget.TenantID)
	if err != nil {
		return fault.Invalid("budget of %s: %w", budget.TenantID, err)
	}
	batch := m.pub.NewBatch()
	for _, t := range todo {
		if err := batch.Publish(ctx, subj, ledger.BudgetCrossed(budget, t, start, spent, m.now(), m.source)); err != nil {
			return err
		}
	}
	if err := batch.Wait(ctx); err != nil {
		return fmt.Errorf("publish budget crossing of %s: %w", budget.TenantID, err)
	}
	// The hard stop is in force before the crossing is marked alerted: a
	// write that failed is retried with the redelivery.
	if err := m.exhaust(ctx, budget, todo, month, spent); err != nil {
		return err
	}
	for _, t := range todo {
		first, err := m.store.Alert(ctx, budget.TenantID, month, t.Micros)
		if err != nil {
			return err
		}
		if first {
			m.metrics.budget.Add(ctx, 1)
			m.log.WarnContext(ctx, "budget threshold crossed", "tenant", budget.TenantID, "budget", budget.Name(), "month", month,
				"threshold_micros", t.Micros, "threshold_percent", t.Percent, "spend_micros", spent, "currency", budget.Currency)
		}
	}
	return nil
}
