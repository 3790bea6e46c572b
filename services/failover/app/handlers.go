package app

import (
	"context"
	"errors"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// lose fences a lost node (if this replica wins the fence) and queues its
// rentals. NodeLost goes into b; the caller waits for it.
func (f *Failover) lose(ctx context.Context, l detect.Loss, b eventBatch) error {
	st, err := f.d.Store.Node(ctx, l.Node)
	if capacity.IsNotFound(err) {
		return nil // never registered, or removed from the fleet
	}
	if err != nil {
		return err
	}
	epoch := l.Epoch
	if epoch == 0 {
		epoch = st.Epoch
	}
	if st.Status == capacity.StatusDead || st.Epoch != epoch {
		f.d.Metrics.fence(ctx, "lost")
		return nil // fenced by another replica, or registered again since
	}
	res, err := f.d.Store.Fence(ctx, l.Node, epoch)
	if capacity.IsConflict(err) || capacity.IsNotFound(err) {
		f.d.Metrics.fence(ctx, "lost")
		return nil
	}
	if err != nil {
		return err
	}
	f.d.Metrics.fence(ctx, "won")
	if !l.LastBeat.IsZero() {
		f.d.Metrics.detected(ctx, l.Reason.String(), l.ConfirmedAt.Sub(l.LastBeat))
	}
	f.d.Log.InfoContext(ctx, "node lost and fenced", "node", l.Node, "epoch", epoch, "reason", l.Reason.String(),
		"allocations", len(res.Allocations))
	subj, err := subject.Format(subject.NodeLost, l.Node)
	if err != nil {
		return fault.Invalid("%w", err)
	}
	lost := nodeLost(l, epoch, len(res.Allocations), f.d.Source)
	if err := b.Publish(ctx, subj, lost); err != nil {
		return err
	}
	reason := shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST
	if l.Reason == detect.ReasonFatalHealth {
		reason = shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY
	}
	return f.queueMoves(ctx, allocationsOf(res.Allocations), migrate.Order{
		Node: l.Node, Epoch: epoch, Reason: int32(reason), Mode: migrate.ModeBreak, LastAlive: l.LastBeat, LastBeat: l.LastBeat,
		Decided: l.ConfirmedAt, Cause: lost.GetMeta().GetEventId(),
	})
}

// onHealth: a failed GPU moves the rentals on it; a failed node is lost.
func (f *Failover) onHealth(ctx context.Context, ev *shizuv1.NodeHealthChanged, d bus.Delivery) error {
	if ev.GetHealth() != shizuv1.Health_HEALTH_FAILED {
		return nil // degraded GPUs take no new work: the scheduler's concern
	}
	if ev.GetGpuIndex() < 0 {
		return f.nodeFailed(ctx, ev)
	}
	now := f.d.Now()
	node, epoch := ev.GetNodeId(), uint64(ev.GetEpoch())
	st, err := f.d.Store.Node(ctx, node)
	if capacity.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Epoch != epoch || st.Status == capacity.StatusDead {
		return nil // about an older registration
	}
	onGPU := migrate.OnGPU(allocationsOf(st.Allocations), int(ev.GetGpuIndex()))
	f.d.Log.InfoContext(ctx, "GPU failed; moving its rentals", "node", node, "gpu", ev.GetGpuIndex(), "rentals", len(onGPU))
	at := ev.GetMeta().GetOccurredAt().AsTime()
	return f.queueMoves(ctx, onGPU, migrate.Order{Node: node, Epoch: epoch,
		Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY), Mode: migrate.ModeBreak, StopOld: true,
		LastAlive: at, Decided: now, Cause: d.MsgID})
}

// nodeFailed: the node reported itself failed as a whole. It is lost here,
// before the ack, so a replica that dies now does not lose the failure;
// the detector's own report then finds it fenced. The node is alive until
// the failure it reports: that is when its rentals stopped running.
func (f *Failover) nodeFailed(ctx context.Context, ev *shizuv1.NodeHealthChanged) error {
	now := f.d.Now()
	node, epoch := ev.GetNodeId(), uint64(ev.GetEpoch())
	f.mu.Lock()
	f.det.Failed(node, epoch, now)
	f.mu.Unlock()
	at := ev.GetMeta().GetOccurredAt().AsTime()
	b := f.newBatch()
	if err := f.lose(ctx, detect.Loss{Node: node, Epoch: epoch, Reason: detect.ReasonFatalHealth,
		LastBeat: at, SuspectedAt: at, ConfirmedAt: now}, b); err != nil {
		return err
	}
	return b.Wait(ctx)
}

// allocationsOf is what failover's decisions read of allocations.
func allocationsOf(as []capacity.Allocation) []migrate.Allocation {
	out := make([]migrate.Allocation, len(as))
	for i, a := range as {
		out[i] = migrate.Allocation{Rental: a.RentalID, Tenant: a.Tenant, HandingOver: a.HandingOver}
		for _, g := range a.GPUs {
			out[i].GPUs = append(out[i].GPUs, g.Index)
		}
	}
	return out
}

// onInterruption: a spot node is reclaimed at the deadline. It takes no new
// work from now; its rentals are placed elsewhere while they still run
// (make-before-break), and whatever is left at the deadline is fenced.
func (f *Failover) onInterruption(ctx context.Context, ev *shizuv1.NodeInterruptionNoticed, d bus.Delivery) error {
	node, epoch := ev.GetNodeId(), uint64(ev.GetEpoch())
	deadline := ev.GetDeadline().AsTime()
	f.mu.Lock()
	f.det.Interrupted(node, epoch, deadline, ev.GetMeta().GetOccurredAt().AsTime())
	f.mu.Unlock()
	f.kick()
	err := f.d.Store.SetStatus(ctx, node, capacity.StatusDraining, epoch)
	switch {
	case capacity.IsNotFound(err), capacity.IsConflict(err), errors.Is(err, capacity.ErrFenced):
		return nil // gone, fenced or registered again: nothing to move
	case err != nil:
		return err
	}
	allocs, err := f.d.Store.Allocations(ctx, node)
	if err != nil {
		return err
	}
	f.d.Log.InfoContext(ctx, "spot interruption; moving rentals before the deadline", "node", node, "deadline", deadline,
		"rentals", len(allocs))
	return f.queueMoves(ctx, allocationsOf(allocs), migrate.Order{Node: node, Epoch: epoch,
		Reason: int32(shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION), Mode: migrate.ModeMakeBeforeBreak,
		Decided: f.d.Now(), Cause: d.MsgID})
}

// onRegistered: a node (re)registered. A flapping node is quarantined: it
// is marked draining (no new work) until its back-off ends.
func (f *Failover) onRegistered(ctx context.Context, ev *shizuv1.NodeRegistered, _ bus.Delivery) error {
	node, epoch := ev.GetNodeId(), uint64(ev.GetEpoch())
	f.mu.Lock()
	q, flapping := f.det.Registered(node, epoch, f.d.Now())
	f.mu.Unlock()
	if !flapping {
		return nil
	}
	if err := f.quarantines.Put(ctx, detect.Quarantine{Node: node, Epoch: epoch, Until: q.Until}); err != nil {
		return err
	}
	err := f.d.Store.SetStatus(ctx, node, capacity.StatusDraining, epoch)
	switch {
	case capacity.IsNotFound(err), capacity.IsConflict(err), errors.Is(err, capacity.ErrFenced):
		return nil
	case err != nil:
		return err
	}
	f.d.Metrics.quarantined(ctx)
	f.d.Log.WarnContext(ctx, "flapping node quarantined", "node", node, "epoch", epoch, "losses", q.Losses, "until", q.Until)
	return nil
}

// unquarantine puts a quarantined node back in service, if it is still
// the registration failover quarantined.
func (f *Failover) unquarantine(ctx context.Context, node string, epoch uint64) error {
	err := f.d.Store.SetStatus(ctx, node, capacity.StatusReady, epoch)
	switch {
	case capacity.IsNotFound(err), capacity.IsConflict(err), errors.Is(err, capacity.ErrFenced):
	case err != nil:
		return err
	default:
		f.d.Log.InfoContext(ctx, "quarantine over", "node", node, "epoch", epoch)
	}
	return f.quarantines.Drop(ctx, node)
}

func (f *Failover) onDrained(_ context.Context, ev *shizuv1.NodeDrained, _ bus.Delivery) error {
	f.mu.Lock()
	f.det.Drained(ev.GetNodeId(), uint64(ev.GetEpoch()), ev.GetMeta().GetOccurredAt().AsTime())
	f.mu.Unlock()
	return nil
}

// onScheduled remembers each rental's latest placement (its spec and
// attempt are what a move re-queues) and measures fence-to-scheduled.
func (f *Failover) onScheduled(ctx context.Context, ev *shizuv1.RentalScheduled, _ bus.Delivery) error {
	if !f.ready.Load() {
		return errRecordsLost
	}
	if err := f.placements.Put(ctx, ev.GetRentalId(), migrate.Placement{Attempt: ev.GetAttempt(), Tenant: ev.GetTenantId(),
		Node: ev.GetNodeId(), Spec: ev.GetSpec(), Model: ev.GetGpuModel(), VRAMMiB: gpuVRAM(ev.GetGpus())}); err != nil {
		return err
	}
	m, ok, err := f.moves.Get(ctx, ev.GetRentalId())
	if err != nil || !ok || m.Scheduled || m.NextAttempt == 0 || ev.GetAttempt() < m.NextAttempt {
		return err
	}
	f.d.Metrics.scheduled(ctx, ev.GetMeta().GetOccurredAt().AsTime().Sub(m.DecidedAt))
	m.Scheduled = true
	return f.moves.Put(ctx, m)
}

// gpuVRAM is the memory per GPU of a placement: the least of its GPUs'
// (all of one model); 0 when none says.
func gpuVRAM(gs []*shizuv1.GpuAssignment) int64 {
	var least int64
	for _, g := range gs {
		if v := g.GetVramMib(); v > 0 && (least == 0 || v < least) {
			least = v
		}
	}
	return least
}

// onStarted completes a migration: the new attempt runs. A
// make-before-break move stops the old run now.
func (f *Failover) onStarted(ctx context.Context, ev *shizuv1.RentalStarted, d bus.Delivery) error {
	if !f.ready.Load() {
		return errRecordsLost
	}
	m, ok, err := f.moves.Get(ctx, ev.GetRentalId())
	if err != nil || !ok {
		return err
	}
	// A start of the next attempt completes the move even if this replica
	// has not marked it handed over yet: the scheduler placed that attempt
	// because of the RentalMigrating, whose ack this start overtook.
	if m.NextAttempt == 0 || ev.GetAttempt() < m.NextAttempt {
		return nil // the old run's start
	}
	if m.Mode == migrate.ModeMakeBeforeBreak && m.FromAttempt > 0 {
		b := f.newBatch()
		if err := f.stopRun(ctx, b, m, shizuv1.ExitReason_EXIT_REASON_MIGRATED); err != nil {
			return err
		}
		if err := b.Wait(ctx); err != nil {
			return err
		}
	}
	down := migrate.Downtime(m.LastAlive, ev.GetStartedAt().AsTime())
	subj, err := subject.Format(subject.RentalMigrated, m.Tenant)
	if err != nil {
		return fault.Invalid("%w", err)
	}
	ckpt := ""
	if p, known, err := f.placements.Get(ctx, m.Rental); err != nil {
		return err
	} else if known {
		ckpt = p.Spec.GetCheckpointUri()
	}
	b := f.newBatch()
	if err := b.Publish(ctx, subj, rentalMigrated(m, ev, down, ckpt, d.MsgID, f.d.Source, f.d.Now())); err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	f.d.Metrics.migrated(ctx, shizuv1.MigrationReason(m.Reason).String(), down)
	return f.moves.Drop(ctx, m.Rental)
}

// onStopped frees the allocation of a run handed over by a
// make-before-break move once that run stopped (the scheduler frees only
// a rental's live allocation), and forgets a rental whose latest run
// ended.
func (f *Failover) onStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	if !f.ready.Load() {
		return errRecordsLost
	}
	if _, err := f.d.Store.ReleaseHandedOver(ctx, ev.GetNodeId(), ev.GetRentalId()); err != nil {
		return err
	}
	return f.placements.Forget(ctx, ev.GetRentalId(), ev.GetAttempt())
}

// stopRun tells the old node's agent to stop the moved rental's old run;
// the command goes into b.
func (f *Failover) stopRun(ctx context.Context, b eventBatch, m migrate.Record, reason shizuv1.ExitReason) error {
	subj, err := subject.Format(subject.AgentCmd, m.FromNode, "stop")
	if err != nil {
		return fault.Invalid("%w", err)
	}
	return b.Publish(ctx, subj, stopRental(m, reason, f.cfg.StopGrace, f.d.Now(), f.d.Source))
}
