package shizuv1

// Validate checks a budget crossing: ids, a period with period_end after
// period_start, a positive threshold, a percentage 0..1000 that comes with
// the budget's amount (0 without one), and a spend of at least the
// threshold, every amount in the threshold's currency; a grace only
// under BUDGET_POLICY_STOP_RUNNING, and exhausted only for the budget's
// amount (100 %) under a policy that stops.
func (m *BudgetThresholdCrossed) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("tenant_id", m.GetTenantId())
	p.token("budget_id", m.GetBudgetId())
	startOK := p.timestamp("period_start", m.GetPeriodStart())
	endOK := p.timestamp("period_end", m.GetPeriodEnd())
	if startOK && endOK && !m.GetPeriodEnd().AsTime().After(m.GetPeriodStart().AsTime()) {
		p.addf("period_end", "%s is not after period_start %s", fmtTime(m.GetPeriodEnd()), fmtTime(m.GetPeriodStart()))
	}
	threshold, spent, amount := m.GetThreshold(), m.GetSpent(), m.GetBudgetAmount()
	p.nest("threshold", threshold.Validate())
	if threshold != nil && threshold.GetMicros() == 0 {
		p.addf("threshold.micros", "0 is not positive")
	}
	p.nest("spent", spent.Validate())
	if threshold != nil && spent != nil {
		if spent.GetCurrency() != threshold.GetCurrency() {
			p.addf("spent.currency", "%q differs from threshold.currency %q", spent.GetCurrency(), threshold.GetCurrency())
		} else if spent.GetMicros() < threshold.GetMicros() {
			p.addf("spent.micros", "%d is below the threshold %d", spent.GetMicros(), threshold.GetMicros())
		}
	}
	pct := m.GetThresholdPercent()
	switch {
	case pct == 0 && amount != nil:
		p.addf("threshold_percent", "missing: the budget has an amount")
	case pct != 0 && amount == nil:
		p.addf("budget_amount", "missing: the threshold is a percentage (%d)", pct)
	case pct != 0:
		p.inRange("threshold_percent", int64(pct), 1, 1000)
		p.nest("budget_amount", amount.Validate())
		if threshold != nil && amount.GetCurrency() != threshold.GetCurrency() {
			p.addf("budget_amount.currency", "%q differs from threshold.currency %q", amount.GetCurrency(), threshold.GetCurrency())
		}
	}
	p.budgetPolicy(m)
	return p.err()
}

func (p *problems) budgetPolicy(m *BudgetThresholdCrossed) {
	policy := m.GetPolicy()
	p.enum("policy", policy, false)
	if g := m.GetGrace(); g != nil {
		if policy != BudgetPolicy_BUDGET_POLICY_STOP_RUNNING {
			p.addf("grace", "set, but policy is %s; only BUDGET_POLICY_STOP_RUNNING has a grace", policy)
		} else {
			p.duration("grace", g, true)
		}
	}
	if !m.GetExhausted() {
		return
	}
	if policy != BudgetPolicy_BUDGET_POLICY_REJECT_NEW && policy != BudgetPolicy_BUDGET_POLICY_STOP_RUNNING {
		p.addf("exhausted", "set, but policy is %s, which stops nothing", policy)
	}
	if m.GetThresholdPercent() != 100 || m.GetThreshold().GetMicros() != m.GetBudgetAmount().GetMicros() {
		p.addf("exhausted", "set, but the threshold is not the budget's amount (100 %%)")
	}
}
