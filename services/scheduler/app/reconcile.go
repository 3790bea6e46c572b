package app

import (
	"context"
	"sync/atomic"

	"github.com/shizu-gpu/shizu/services/scheduler/view"
)

// The reconciler frees allocations no live rental owns. A rental is live
// when the scheduler recorded it placed (its class record, written with
// its scheduled outcome and dropped once its stop is handled); an
// allocation is in flight while it is younger than ReconcileAge (reserved,
// its outcome not recorded yet, or its redelivery about to adopt it). An
// allocation older than that with no placed record is a reservation whose
// replica died before it recorded anything and whose request will not
// come again (a redelivery adopts it within the consumer's ack wait): it
// is released. A previous run kept during a hand-over is failover's, and
// is left alone.
type reconciler struct{ running atomic.Bool }

// reconcileSoon starts a reconcile pass off the loop unless one runs.
func (s *Scheduler) reconcileSoon(ctx context.Context) {
	if s.d.Store == nil || !s.reconciling.running.CompareAndSwap(false, true) {
		return
	}
	s.publishers.Go(func() {
		defer s.reconciling.running.Store(false)
		// A pass runs on whole records only: one without the class records
		// of the rentals that run would free their allocations.
		s.onWholeRecords(func() { s.reconcilePass(ctx) })
	})
}

// reconcilePass is one pass, logged.
func (s *Scheduler) reconcilePass(ctx context.Context) {
	if n, err := s.reconcile(ctx); err != nil {
		s.d.Log.WarnContext(ctx, "reconcile allocations", "err", err)
	} else if n > 0 {
		s.d.Log.WarnContext(ctx, "released allocations no live rental owns", "count", n)
	}
}

// reconcile is one pass; it returns how many allocations it released.
func (s *Scheduler) reconcile(ctx context.Context) (int, error) {
	snap, err := s.d.Store.Snapshot(ctx)
	if err != nil {
		return 0, err
	}
	now := s.d.Now()
	node := map[string]string{}
	var old []string
	for i := range snap.Nodes {
		for _, a := range snap.Nodes[i].Allocations {
			if a.HandingOver || now.Sub(a.CreatedAt) < s.cfg.ReconcileAge {
				continue
			}
			node[a.RentalID] = snap.Nodes[i].ID
			old = append(old, a.RentalID)
		}
	}
	if len(old) == 0 {
		return 0, nil
	}
	placed, err := s.rec.Classes(ctx, old)
	if err != nil {
		return 0, err
	}
	released := 0
	for _, id := range old {
		if _, live := placed[id]; live {
			continue
		}
		// Read again: the rental may have been placed (adopted) or
		// released since the snapshot.
		a, err := s.reserve.Allocation(ctx, id)
		if err != nil || a.NodeID != node[id] || a.HandingOver || now.Sub(a.CreatedAt) < s.cfg.ReconcileAge {
			continue
		}
		if live, err := s.rec.Placed(ctx, id); err != nil || live {
			continue
		}
		ok, err := s.reserve.Release(ctx, id)
		if err != nil {
			return released, err
		}
		if ok {
			released++
			s.d.Log.WarnContext(ctx, "released an allocation no live rental owns", "rental", id, "node", a.NodeID, "created", a.CreatedAt)
			s.view.Post(view.Fix{Node: a.NodeID, Rental: id})
		}
	}
	if released > 0 {
		s.wake()
	}
	return released, nil
}
