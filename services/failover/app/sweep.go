package app

import (
	"context"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// sweep recovers from a replica that died mid-way: migrations recorded but
// never handed over (not those recorded as failed: they would fail again),
// a dead node whose allocations nobody released, a node that died while no
// replica watched, quarantines past their end.
func (f *Failover) sweep(ctx context.Context) error {
	now := f.d.Now()
	stale, err := f.staleMoves(ctx, now)
	if err != nil {
		return err
	}
	snap, err := f.d.Store.Snapshot(ctx)
	if err != nil {
		return err
	}
	if err := f.moveOrphans(ctx, snap.Nodes, now); err != nil {
		return err
	}
	f.push(stale...)
	if err := f.suspectSilentNodes(ctx, snap.Nodes, now); err != nil {
		return err
	}
	return f.endQuarantines(ctx, now)
}

// staleMoves are the recorded moves a replica left unpublished a sweep
// period ago or more (migrate.Stale), read in two round trips.
func (f *Failover) staleMoves(ctx context.Context, now time.Time) ([]migrate.Move, error) {
	ids, err := f.moves.List(ctx)
	if err != nil {
		return nil, err
	}
	recorded, err := f.moves.GetMany(ctx, ids)
	if err != nil {
		return nil, err
	}
	return migrate.Stale(ids, recorded, now, f.cfg.Sweep), nil
}

// moveOrphans queues the moves of dead nodes' allocations that no recorded
// move covers (migrate.Orphans), one read of the records per dead node.
func (f *Failover) moveOrphans(ctx context.Context, nodes []capacity.NodeState, now time.Time) error {
	for i := range nodes {
		n := &nodes[i]
		if n.Status != capacity.StatusDead || len(n.Allocations) == 0 {
			continue
		}
		allocs := allocationsOf(n.Allocations)
		rentals := make([]string, len(allocs))
		for j, a := range allocs {
			rentals[j] = a.Rental
		}
		moving, err := f.moves.GetMany(ctx, rentals)
		if err != nil {
			return err
		}
		orphans := migrate.Orphans(n.ID, allocs, moving)
		if len(orphans) == 0 {
			continue
		}
		// Fenced at the epoch before the dead one.
		if err := f.queueMoves(ctx, orphans, migrate.Order{Node: n.ID, Epoch: n.Epoch - 1,
			Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST), Mode: migrate.ModeBreak, Decided: now,
			Cause: nodeLostID(n.ID, n.Epoch-1)}); err != nil {
			return err
		}
	}
	return nil
}

// suspectSilentNodes: a node that stopped beating while no replica watched
// (or before this one started) left no expiry to see, so a live node
// without a heartbeat key is suspect. Stamped one TTL back, so any beat of
// the last TTL, even one the watch delivers late, clears the suspicion.
func (f *Failover) suspectSilentNodes(ctx context.Context, nodes []capacity.NodeState, now time.Time) error {
	ttl := f.d.Heartbeats.TTL()
	for i := range nodes {
		n := &nodes[i]
		if n.Status == capacity.StatusDead {
			continue
		}
		f.mu.Lock()
		recent := now.Sub(f.det.LastBeat(n.ID)) < ttl
		f.mu.Unlock()
		if recent {
			continue
		}
		alive, _, err := f.d.Heartbeats.Alive(ctx, n.ID)
		if err != nil {
			return err
		}
		if !alive {
			f.mu.Lock()
			f.det.Known(n.ID, n.Epoch)
			f.det.Expired(n.ID, now.Add(-ttl))
			f.mu.Unlock()
		}
	}
	return nil
}

// endQuarantines ends the quarantines past their end (another replica's
// detector may have decided them).
func (f *Failover) endQuarantines(ctx context.Context, now time.Time) error {
	qs, err := f.quarantines.List(ctx)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if !now.Before(q.Until) {
			if err := f.unquarantine(ctx, q.Node, q.Epoch); err != nil {
				return err
			}
		}
	}
	return nil
}
