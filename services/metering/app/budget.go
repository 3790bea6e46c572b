package app

import (
	"context"
	"fmt"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The budget hard stop, metering's side. A budget whose policy stops
// (reject-new, stop-running) has a 100 % threshold (its amount); when the
// tenant's month spend reaches it, alertBudget publishes the crossing
// (with the policy, the grace and exhausted set) and then writes the
// tenant's budget.State in the BUDGETS bucket, before marking the
// crossing alerted, so a failed write is retried with the redelivery. The
// scheduler replicas watch the bucket. The state is in force for its
// month only (a new month lifts it by itself); LiftBudgets, at start,
// lifts or rewrites the states the accounts no longer justify (a budget
// raised, removed, or whose policy no longer stops).

// BudgetStates is what the meter needs of the BUDGETS bucket; a
// *budgetkv.Store is the real one.
type BudgetStates interface {
	// Put writes a tenant's state (keeping its first ExhaustedAt of the
	// month and limit) and returns the state stored.
	Put(ctx context.Context, st budget.State) (budget.State, error)
	// Delete lifts a tenant's state.
	Delete(ctx context.Context, tenant string) error
	// All lists every state.
	All(ctx context.Context) ([]budget.State, error)
}

// ensureBudgets creates the BUDGETS bucket with the replicas of the
// BILLING stream its states are derived from.
func ensureBudgets(ctx context.Context, conn *bus.Conn) (*budgetkv.Store, error) {
	js := conn.JetStream()
	billing, err := js.Stream(ctx, topology.StreamBilling)
	if err != nil {
		return nil, fmt.Errorf("metering: read stream %s: %w", topology.StreamBilling, err)
	}
	info, err := billing.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("metering: read stream %s: %w", topology.StreamBilling, err)
	}
	return budgetkv.Ensure(ctx, js, info.Config.Replicas)
}

// exhaust writes the budget state of the thresholds in todo that exhaust
// the budget (at most one: its amount).
func (m *Meter) exhaust(ctx context.Context, b ledger.Budget, todo []ledger.Threshold, month string, spent int64) error {
	if m.budgets == nil {
		return nil
	}
	for _, t := range todo {
		if !b.Exhausts(t) {
			continue
		}
		st, err := m.budgets.Put(ctx, b.Exhausted(month, spent, m.now()))
		if err != nil {
			return fmt.Errorf("budget of %s: %w", b.TenantID, err)
		}
		m.log.WarnContext(ctx, "budget exhausted: hard stop in force", "tenant", st.Tenant, "budget", st.Budget, "month", st.Month,
			"policy", string(st.Policy), "spend_micros", st.SpentMicros, "limit_micros", st.LimitMicros, "exhausted_at", st.ExhaustedAt)
	}
	return nil
}

// LiftBudgets checks every budget state against the accounts: a state of
// another month, of a tenant with no budget now, of a budget whose policy
// no longer stops or whose amount is now above the spend the state saw,
// is lifted; one whose policy, grace or amount changed but still stops is
// rewritten. A raised budget the tenant's spend already passes again is
// exhausted anew by the next usage record (its new amount is a threshold
// not alerted yet).
func (m *Meter) LiftBudgets(ctx context.Context) error {
	if m.budgets == nil {
		return nil
	}
	states, err := m.budgets.All(ctx)
	if err != nil {
		return err
	}
	month := budget.Month(m.now())
	for _, st := range states {
		b, ok := m.accounts.Budget(st.Tenant)
		switch {
		case !ok || !b.Policy.Stops() || st.Month != month || b.Currency != st.Currency || b.AmountMicros > st.SpentMicros:
			if err := m.budgets.Delete(ctx, st.Tenant); err != nil {
				return err
			}
			m.log.InfoContext(ctx, "budget hard stop lifted", "tenant", st.Tenant, "budget", st.Budget, "month", st.Month)
		default:
			want := b.Exhausted(st.Month, st.SpentMicros, st.ExhaustedAt)
			if want == st {
				continue
			}
			if _, err := m.budgets.Put(ctx, want); err != nil {
				return err
			}
		}
	}
	return nil
}
