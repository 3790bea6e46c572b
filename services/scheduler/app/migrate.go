package app

import (
	"context"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/history"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// onMigrating places a rental that failover moves off a lost node (or a
// failed GPU, or a spot node about to be reclaimed) again: with its
// original spec, as placement attempt next_attempt, queued by the time it
// was lost so it goes ahead of requests that arrived since, preferring the
// GPU model it ran on (from_gpu_model). An allocation
// still recorded on the node it leaves is released first, or the
// idempotent reserve would hand that one back; a spot hand-over
// (make-before-break) keeps the old run going on its allocation until the
// new one starts, so the store is asked for the rental only on the node
// it leaves.
func (s *Scheduler) onMigrating(ctx context.Context, ev *shizuv1.RentalMigrating, _ bus.Delivery) error {
	id := ev.GetRentalId()
	if err := s.checkOwner(ctx, "RentalMigrating", id, ev.GetTenantId()); err != nil {
		return err
	}
	// Failover sends attempt 0 and no spec when it never saw the rental
	// scheduled. Without them a placement could neither be told from an
	// earlier one (attempt 0 shares attempt 1's outcome) nor made: the
	// event is dead-lettered with the reason, for an operator.
	if ev.GetNextAttempt() < 2 || ev.GetSpec() == nil {
		return fault.Invalid("rental %s: RentalMigrating with next_attempt %d and %s cannot be placed again (failover did not know the rental's placement)",
			id, ev.GetNextAttempt(), map[bool]string{true: "a spec", false: "no spec"}[ev.GetSpec() != nil])
	}
	if newer, err := s.rec.PlacedAfter(ctx, id, ev.GetNextAttempt()); err != nil {
		return err
	} else if newer {
		return nil // a later move already placed it
	}
	a, err := s.d.Store.Allocation(ctx, id)
	switch {
	case capacity.IsNotFound(err):
	case err != nil:
		return err
	case a.NodeID == ev.GetFromNodeId():
		if _, err := s.d.Store.Release(ctx, id); err != nil {
			return err
		}
		// The view belongs to the loop: it takes the release out before
		// it next places.
		s.view.Post(view.Fix{Node: a.NodeID, Rental: id})
	}
	req := history.Requeued(ev, s.source)
	r := requestOf(req)
	if m := ev.GetFromGpuModel(); m != "" {
		// Not a filter: the spec alone says what may be chosen; among
		// what may, the model it ran on comes first.
		r.PreferredModels = []string{m}
	}
	if err := r.Validate(s.catalogue); err != nil {
		// The spec was placed before; a catalogue that changed since
		// cannot place it again. Say so to the tenant.
		return s.rejectNow(ctx, req, ev.GetNextAttempt(), shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC, err.Error())
	}
	s.d.Log.InfoContext(ctx, "placing migrating rental again", "rental", id, "from_node", ev.GetFromNodeId(),
		"attempt", ev.GetNextAttempt(), "reason", ev.GetReason().String())
	return s.submit(ctx, req, r, ev.GetNextAttempt())
}
