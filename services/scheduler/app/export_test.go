package app

import (
	"context"
	"time"
)

// SetAfterReserve installs the failpoint between a round's reservations
// and the record of their outcomes (see Scheduler.afterReserve).
func SetAfterReserve(s *Scheduler, hook func(rentals []string) error) { s.afterReserve = hook }

// BudgetInForce says whether the replica's budgets book blocks tenant's
// new rentals at now.
func BudgetInForce(s *Scheduler, tenant string, now time.Time) bool {
	_, ok := s.budgets.inForce(tenant, now)
	return ok
}

// SweepBudgets runs one budget sweep now (the replica also runs them every
// PendingRetry).
func SweepBudgets(ctx context.Context, s *Scheduler) {
	s.onWholeRecords(func() { s.sweepBudgets(ctx) })
}
