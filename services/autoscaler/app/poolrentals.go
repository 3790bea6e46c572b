package app

import (
	"context"
	"slices"
	"strconv"
	"strings"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Pool rentals that end: a rejected or stopped replica leaves its pool record.

// poolOfRental finds the pool a rental id ("pool-<pool>-<seq>") of tenant
// belongs to.
func (s *scaler) poolOfRental(ctx context.Context, rental, tenant string) (policy.Pool, bool, error) {
	if !strings.HasPrefix(rental, "pool-") {
		return policy.Pool{}, false, nil
	}
	pools, err := s.allPools(ctx)
	if fault.IsUnavailable(err) {
		return policy.Pool{}, false, err // Redis: try again
	}
	for _, p := range pools {
		rest, ok := strings.CutPrefix(rental, "pool-"+p.ID+"-")
		if !ok || p.Tenant != tenant || rest == "" {
			continue
		}
		if _, err := strconv.Atoi(rest); err == nil {
			return p, true, nil
		}
	}
	return policy.Pool{}, false, nil
}

// onRentalRejected forgets a pool replica the scheduler will never run
// (except the ones the autoscaler cancelled itself, already forgotten).
func (s *scaler) onRentalRejected(ctx context.Context, ev *shizuv1.RentalRejected, _ bus.Delivery) error {
	if !s.ready.Load() {
		return errStateLost
	}
	if ev.GetReason() == shizuv1.RejectReason_REJECT_REASON_CANCELLED {
		return nil
	}
	return s.forget(ctx, ev.GetRentalId(), ev.GetTenantId(), "rejected: "+ev.GetReason().String())
}

// onRentalStopped forgets a pool replica whose workload ended by itself;
// a rental stopped to migrate or by a node failure comes back elsewhere.
func (s *scaler) onRentalStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	if !s.ready.Load() {
		return errStateLost
	}
	switch ev.GetExitReason() {
	case shizuv1.ExitReason_EXIT_REASON_COMPLETED, shizuv1.ExitReason_EXIT_REASON_FAILED:
		return s.forget(ctx, ev.GetRentalId(), ev.GetTenantId(), "stopped: "+ev.GetExitReason().String())
	}
	return nil
}

// forget removes a lost replica from its pool, so the next evaluation
// (a sample, or the tick for floors) replaces it if it is still needed.
func (s *scaler) forget(ctx context.Context, rental, tenant, why string) error {
	pool, ok, err := s.poolOfRental(ctx, rental, tenant)
	if err != nil || !ok {
		return err
	}
	return s.states.update(ctx, pool.ID, func(rec *poolRecord) error {
		i := slices.IndexFunc(rec.Rentals, func(r poolRental) bool { return r.ID == rental })
		if i < 0 {
			return errNoChange
		}
		rec.Rentals = slices.Delete(rec.Rentals, i, i+1)
		rec.State.Replicas = len(rec.Rentals)
		s.log.InfoContext(ctx, "pool replica lost", "pool", pool.ID, "rental", rental, "why", why, "replicas", len(rec.Rentals))
		return nil
	})
}
