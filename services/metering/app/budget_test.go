package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/budget"
	"github.com/shizu-gpu/shizu/shared/budget/budgetkv"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// writeAccounts writes an accounts file with one budget of tenant t0.
func writeAccounts(t *testing.T, budgetJSON string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "accounts.json")
	if err := os.WriteFile(path, []byte(`{"budgets":[`+budgetJSON+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAnExhaustedBudgetThatStopsPutsItsStateInTheBucket: real usage of
// tenant t0 reaches its stop-running budget; metering (as its own NATS
// user) publishes the 100 % crossing with the policy and grace and writes
// the tenant's state in BUDGETS. Restarted with the budget raised above
// the spend, it lifts the state.
func TestAnExhaustedBudgetThatStopsPutsItsStateInTheBucket(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	cfg := testConfig()
	var rentals []rental
	for i := range 3 {
		start := base.Add(time.Duration(i) * time.Minute)
		rentals = append(rentals, rental{id: fmt.Sprintf("s-%d", i), tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1",
			plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
			segs: []seg{{node: "node-1", start: start, stop: start.Add(5 * time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}})
	}
	want := expectedLedger(t, cfg, rentals)
	spend := total(want)
	cfg.AccountsPath = writeAccounts(t, fmt.Sprintf(`{"tenant_id":"t0","currency":"USD","amount_micros":%d,"policy":"stop-running","grace":"90s"}`, spend))
	conn := e.Connect(t, topology.Metering)
	states, err := budgetkv.Ensure(t.Context(), conn.JetStream(), 1)
	if err != nil {
		t.Fatal(err)
	}
	startWith := func(cfg app.Config) *app.Meter {
		m, err := app.NewMeter(cfg, app.Deps{Store: redisstore.New(e.rdb, cfg.KeyPrefix), Conn: conn, Log: quietLog(t), Now: fixed(base), Budgets: states})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := startWith(cfg)
	parts, err := m.Start(t.Context(), consumers(), 0)
	if err != nil {
		t.Fatal(err)
	}
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, want)
	e.drained(t)
	for i := len(parts) - 1; i >= 0; i-- {
		_ = parts[i].Stop(t.Context())
	}

	got := e.budgetCrossings(t)
	if len(got) != 1 || !got[0].GetExhausted() || got[0].GetPolicy() != shizuv1.BudgetPolicy_BUDGET_POLICY_STOP_RUNNING ||
		got[0].GetGrace().AsDuration() != 90*time.Second || got[0].GetThresholdPercent() != 100 {
		t.Fatalf("crossings %v, want one exhausting 100 %% crossing under stop-running with a 90 s grace", got)
	}
	st, ok, err := states.Get(t.Context(), "t0")
	if err != nil || !ok {
		t.Fatalf("no budget state for t0 (%v)", err)
	}
	if st.Policy != budget.StopRunning || st.LimitMicros != spend || st.SpentMicros < spend || st.Month != "2026-11" ||
		st.Grace() != 90*time.Second || !st.ExhaustedAt.Equal(base) {
		t.Fatalf("state %+v", st)
	}

	// The same budget at restart keeps the state; raised above the
	// spend, it is lifted.
	if err := startWith(cfg).LiftBudgets(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := states.Get(t.Context(), "t0"); !ok {
		t.Fatal("an unchanged budget lifted its state at restart")
	}
	raised := cfg
	raised.AccountsPath = writeAccounts(t, fmt.Sprintf(`{"tenant_id":"t0","currency":"USD","amount_micros":%d,"policy":"stop-running"}`, 2*spend))
	if err := startWith(raised).LiftBudgets(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := states.Get(t.Context(), "t0"); ok {
		t.Fatal("a budget raised above the spend did not lift its state")
	}
}

// TestAnAlertBudgetWritesNoState: the same spend under the alert policy
// publishes its crossings and puts nothing in force.
func TestAnAlertBudgetWritesNoState(t *testing.T) {
	t.Parallel()
	e := newEnvWithUsers(t)
	cfg := testConfig()
	start := base
	rentals := []rental{{id: "a-0", tenant: "t0", model: "H100-SXM5-80GB", zone: "eu-1", plan: shizuv1.Plan_PLAN_ON_DEMAND, gpus: 1, milli: 1000,
		segs: []seg{{node: "node-1", start: start, stop: start.Add(5 * time.Minute), exit: shizuv1.ExitReason_EXIT_REASON_COMPLETED}}}}
	want := expectedLedger(t, cfg, rentals)
	cfg.AccountsPath = writeAccounts(t, fmt.Sprintf(`{"tenant_id":"t0","currency":"USD","amount_micros":%d,"thresholds_percent":[100],"policy":"alert"}`, total(want)))
	conn := e.Connect(t, topology.Metering)
	states, err := budgetkv.Ensure(t.Context(), conn.JetStream(), 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := app.NewMeter(cfg, app.Deps{Store: redisstore.New(e.rdb, cfg.KeyPrefix), Conn: conn, Log: quietLog(t), Now: fixed(base), Budgets: states})
	if err != nil {
		t.Fatal(err)
	}
	parts, err := m.Start(t.Context(), consumers(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := len(parts) - 1; i >= 0; i-- {
			_ = parts[i].Stop(t.Context())
		}
	})
	e.publish(t, allEvents(rentals))
	e.settled(t, cfg.KeyPrefix, want)
	e.drained(t)
	got := e.budgetCrossings(t)
	if len(got) != 1 || got[0].GetExhausted() || got[0].GetPolicy() != shizuv1.BudgetPolicy_BUDGET_POLICY_ALERT {
		t.Fatalf("crossings %v, want one 100 %% crossing under alert, not exhausted", got)
	}
	if all, err := states.All(t.Context()); err != nil || len(all) != 0 {
		t.Fatalf("states %+v (%v), want none", all, err)
	}
}
