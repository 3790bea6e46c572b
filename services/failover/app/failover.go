package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Deps are what a failover replica runs on.
type Deps struct {
	Bus        *bus.Conn
	Heartbeats *bus.Heartbeats
	Store      *capacity.Store
	Redis      redis.UniversalClient
	Log        *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics may be nil.
	Metrics *Metrics
	// Source names this replica in EventMeta.source (default "failover").
	Source string
}

// Failover is one replica. Every replica watches every heartbeat and
// decides losses on its own; the capacity store's fence lets exactly one of
// them act on each loss. Node and rental events are work-shared between
// replicas through the durable consumers.
type Failover struct {
	cfg Config
	d   Deps
	rec records

	mu    sync.Mutex // guards det and queue
	det   *detect.Detector
	queue *migrate.Queue
	wake  chan struct{}
	// holdUntil: the moves wait until then for losses about to be
	// confirmed (see step); owned by the Run loop.
	holdUntil time.Time
}

// New builds a replica.
func New(cfg Config, d Deps) (*Failover, error) {
	if d.Bus == nil || d.Heartbeats == nil || d.Store == nil || d.Redis == nil {
		return nil, errors.New("failover: bus, heartbeats, store and redis are required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Source == "" {
		d.Source = "failover"
	}
	det, err := detect.New(cfg.Detect)
	if err != nil {
		return nil, err
	}
	q, err := migrate.NewQueue(cfg.Pace)
	if err != nil {
		return nil, err
	}
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = "shizu"
	}
	return &Failover{cfg: cfg, d: d, rec: records{rdb: d.Redis, prefix: prefix}, det: det, queue: q,
		wake: make(chan struct{}, 1)}, nil
}

// NodeRouter handles the "failover" consumer (node events).
func (f *Failover) NodeRouter() *bus.Router {
	r := bus.NewRouter()
	bus.On(r, f.onHealth)
	bus.On(r, f.onInterruption)
	bus.On(r, f.onRegistered)
	bus.On(r, f.onDrained)
	return r
}

// RentalRouter handles the "failover-rentals" consumer.
func (f *Failover) RentalRouter() *bus.Router {
	r := bus.NewRouter()
	bus.On(r, f.onScheduled)
	bus.On(r, f.onStarted)
	bus.On(r, f.onStopped)
	return r
}

func (f *Failover) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run watches heartbeats (and disconnects, when given) and acts on
// decisions until ctx ends.
func (f *Failover) Run(ctx context.Context, disconnects <-chan Disconnect) error {
	changes, err := f.d.Heartbeats.Watch(ctx)
	if err != nil {
		return err
	}
	tick := time.NewTicker(f.cfg.Tick)
	defer tick.Stop()
	sweep := time.NewTicker(f.cfg.Sweep)
	defer sweep.Stop()
	// due fires when the detector's next decision is due (a disconnect's
	// grace ending, say), so a loss is not left waiting for the next tick.
	due := time.NewTimer(f.cfg.Sweep)
	defer due.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ch, ok := <-changes:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("failover: heartbeat watch ended")
			}
			f.observe(ch)
			if ch.Alive {
				continue // a beat decides nothing: the next tick looks
			}
		case dc := <-disconnects:
			f.mu.Lock()
			f.det.Disconnected(dc.Node, dc.At)
			f.mu.Unlock()
		case <-tick.C:
		case <-due.C:
		case <-f.wake:
		case <-sweep.C:
			if err := f.sweep(ctx); err != nil {
				f.d.Log.WarnContext(ctx, "failover sweep failed", "err", err)
			}
		}
		f.step(ctx)
		now := f.d.Now()
		f.mu.Lock()
		next := f.det.NextWake(now)
		if f.holdUntil.After(now) && (next.IsZero() || f.holdUntil.Before(next)) {
			next = f.holdUntil // moves held for an imminent loss
		}
		f.mu.Unlock()
		// Only a decision still ahead: one overdue but undecidable (a node
		// whose epoch is not known yet) would otherwise spin the loop. The
		// tick stays the fallback.
		if next.After(now) && next.Sub(now) < f.cfg.Tick {
			due.Reset(next.Sub(now))
		}
	}
}

// Disconnect is a node agent's connection closing, from the server's
// advisory.
type Disconnect struct {
	Node string
	At   time.Time
}

// observe feeds a heartbeat change to the detector. Beats, expiries and
// disconnects are stamped by the NATS server's clock, so they order
// correctly among themselves however late each reaches this replica; the
// detector's windows compare them with this replica's clock (hosts are
// expected to be NTP-synchronized: skew adds to the windows).
func (f *Failover) observe(ch bus.HeartbeatChange) {
	at := ch.At
	if at.IsZero() {
		at = f.d.Now()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch.Alive {
		epoch, _ := strconv.ParseUint(string(ch.Payload), 10, 64)
		f.det.Beat(ch.Node, epoch, at)
		return
	}
	f.det.Expired(ch.Node, at)
}

// step acts on what the detector and the queue decided at now. The
// NodeLost events of the tick and the hand-over of every move due go out
// in one async publish batch, acknowledged together.
func (f *Failover) step(ctx context.Context) {
	now := f.d.Now()
	f.mu.Lock()
	ds := f.det.Tick(now)
	f.mu.Unlock()
	b := f.d.Bus.NewBatch()
	for _, l := range ds.Lost {
		if err := f.lose(ctx, l, b); err != nil {
			f.d.Log.WarnContext(ctx, "acting on a lost node failed; the sweep retries", "node", l.Node, "err", err)
		}
	}
	for _, q := range ds.Released {
		if err := f.unquarantine(ctx, q.Node, q.Epoch); err != nil {
			f.d.Log.WarnContext(ctx, "ending a quarantine failed; the sweep retries", "node", q.Node, "err", err)
		}
	}
	// Agents killed together are found lost a few milliseconds apart (each
	// at its own disconnect plus the grace). Moves handed over at the first
	// loss could be placed on a node found lost a moment later, and move
	// twice; so they wait (at most a tick) for the losses due that soon.
	f.mu.Lock()
	if len(ds.Lost) > 0 {
		if by := f.det.LossesDueBy(now, now.Add(f.cfg.Tick)); by.After(f.holdUntil) {
			f.holdUntil = by
		}
	}
	var moves []migrate.Move
	if !now.Before(f.holdUntil) {
		moves = f.queue.Pop(f.d.Now())
	}
	f.mu.Unlock()
	ms := make([]migration, len(moves))
	for i, m := range moves {
		ms[i] = m.Value.(migration)
	}
	if err := f.moveAll(ctx, ms, b); err != nil {
		f.d.Log.WarnContext(ctx, "handing rentals over failed; the sweep retries", "rentals", len(ms), "err", err)
	}
}

func lostReason(r detect.Reason) shizuv1.NodeLostReason {
	switch r {
	case detect.ReasonFatalHealth:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_FATAL_HEALTH
	case detect.ReasonDisconnected:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_AGENT_DISCONNECTED
	case detect.ReasonDeadlinePassed:
		return shizuv1.NodeLostReason_NODE_LOST_REASON_DEADLINE_PASSED
	}
	return shizuv1.NodeLostReason_NODE_LOST_REASON_HEARTBEAT_EXPIRED
}

func (f *Failover) meta(id string, cause string, correlation string, at time.Time) *shizuv1.EventMeta {
	return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(at), Source: f.d.Source,
		CausationId: cause, CorrelationId: correlation}
}

// lose fences a lost node (if this replica wins the fence) and queues its
// rentals. NodeLost goes into b; the caller waits for it.
func (f *Failover) lose(ctx context.Context, l detect.Loss, b *bus.Batch) error {
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
		return fault.Invalid("%v", err)
	}
	lost := &shizuv1.NodeLost{
		Meta:            f.meta(fmt.Sprintf("node:%s:lost:%d", l.Node, epoch), "", l.Node, l.ConfirmedAt),
		NodeId:          l.Node,
		FencedEpoch:     int64(epoch),
		Reason:          lostReason(l.Reason),
		Message:         fmt.Sprintf("%s; %d rentals move", l.Reason, len(res.Allocations)),
		LastHeartbeatAt: tsOrNil(l.LastBeat),
	}
	if err := b.Publish(ctx, subj, lost); err != nil {
		return err
	}
	reason := shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST
	if l.Reason == detect.ReasonFatalHealth {
		reason = shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY
	}
	return f.queueMoves(ctx, res.Allocations, moveOrder{
		node: l.Node, epoch: epoch, reason: reason, mode: modeBreak, lastAlive: l.LastBeat, lastBeat: l.LastBeat,
		decided: l.ConfirmedAt, cause: lost.GetMeta().GetEventId(),
	})
}

func tsOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// moveOrder is what a set of moves shares.
type moveOrder struct {
	node      string
	epoch     uint64
	reason    shizuv1.MigrationReason
	mode      string
	stopOld   bool
	lastAlive time.Time
	lastBeat  time.Time
	decided   time.Time
	cause     string
}

// queueMoves records a migration per allocation and queues it, reading
// and writing the records of all of them in a few pipelined round trips.
// An allocation handed over already (the old run of a make-before-break
// move) is no move: on a lost node it is released, its rental's next
// attempt being placed elsewhere.
func (f *Failover) queueMoves(ctx context.Context, allocs []capacity.Allocation, o moveOrder) error {
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		ids[i] = a.RentalID
	}
	placements, err := f.rec.placementsOf(ctx, ids)
	if err != nil {
		return err
	}
	prevs, err := f.rec.migrationsOf(ctx, ids)
	if err != nil {
		return err
	}
	var ms, revised []migration
	var handedOver []string
	for _, a := range allocs {
		prev, moving := prevs[a.RentalID]
		if a.HandingOver {
			if o.mode != modeBreak {
				continue // handed over before (a redelivered notice)
			}
			handedOver = append(handedOver, a.RentalID)
			if moving && prev.FromNode == o.node && prev.LastAlive.IsZero() && !o.lastAlive.IsZero() {
				// The old run died before the new one started: the
				// downtime runs from its last sign of life.
				prev.LastAlive, prev.LastBeat = o.lastAlive, o.lastBeat
				revised = append(revised, prev)
			}
			continue
		}
		m := migration{
			Rental: a.RentalID, Tenant: a.Tenant, FromNode: o.node, FromEpoch: o.epoch,
			Reason: int32(o.reason), Mode: o.mode, StopOld: o.stopOld, LastAlive: o.lastAlive, LastBeat: o.lastBeat,
			DecidedAt: o.decided, Cause: o.cause, Class: int(migrate.ClassUnknown),
		}
		for _, g := range a.GPUs {
			m.GPUs = append(m.GPUs, g.Index)
		}
		if p, known := placements[a.RentalID]; known {
			m.FromAttempt, m.NextAttempt = p.Attempt, p.Attempt+1
			m.Class, m.Priority = int(classOf(p.Spec.GetPlan())), int(p.Spec.GetPriority())
		}
		if moving && prev.FromNode != o.node && prev.NextAttempt > m.FromAttempt {
			// The rental was already moved off another node and placed
			// here as prev.NextAttempt before this replica read that
			// RentalScheduled: the allocation here is that newer attempt.
			m.FromAttempt, m.NextAttempt = prev.NextAttempt, prev.NextAttempt+1
		}
		if moving && prev.NextAttempt == m.NextAttempt {
			// Already moving (a spot notice's make-before-break, now
			// fenced): keep when it was decided, and break now.
			m.DecidedAt = prev.DecidedAt
			if o.mode == modeMakeBeforeBreak {
				continue
			}
		}
		ms = append(ms, m)
	}
	if err := f.rec.putMigrations(ctx, ms); err != nil {
		return err
	}
	if err := f.rec.updateMigrations(ctx, revised); err != nil {
		return err
	}
	if len(handedOver) > 0 {
		if _, err := f.d.Store.ReleaseOn(ctx, o.node, handedOver...); err != nil {
			return err
		}
	}
	moves := make([]migrate.Move, len(ms))
	for i, m := range ms {
		moves[i] = migrate.Move{Rental: m.Rental, Tenant: m.Tenant, Node: m.FromNode, GPUs: m.GPUs,
			Class: migrate.Class(m.Class), Priority: m.Priority, Since: m.DecidedAt, Value: m}
	}
	f.mu.Lock()
	f.queue.Push(moves...)
	f.mu.Unlock()
	f.kick()
	return nil
}

func classOf(p shizuv1.Plan) migrate.Class {
	switch p {
	case shizuv1.Plan_PLAN_RESERVED:
		return migrate.ClassReserved
	case shizuv1.Plan_PLAN_ON_DEMAND:
		return migrate.ClassOnDemand
	case shizuv1.Plan_PLAN_SPOT:
		return migrate.ClassSpot
	}
	return migrate.ClassUnknown
}

// moveAll hands rentals to the scheduler, all at once: stop the old runs
// that must stop, release (break) or hand over (make-before-break) the
// old allocations, publish every RentalMigrating, then wait once for
// every ack in b (with whatever the caller queued there) and mark the
// moves handed over. The records and the break releases take a few
// pipelined Redis round trips whatever the number of rentals; each
// make-before-break adds one (its capacity hand-over). A move that can
// never go out (invalid input: a tenant or node id that is no subject
// token, a rental id the store refuses) is set aside before anything of
// it is released, recorded as failed and counted; the others proceed. A
// store or bus failure returns, leaving the records unpublished for the
// sweep; every step is idempotent and every event has a fixed id, so the
// retry is deduplicated.
func (f *Failover) moveAll(ctx context.Context, ms []migration, b *bus.Batch) error {
	if len(ms) == 0 {
		if b.Len() > 0 {
			_, err := b.Wait(ctx)
			return err
		}
		return nil
	}
	var failed []migration
	fail := func(m migration, err error) {
		f.d.Log.ErrorContext(ctx, "a rental cannot be moved; it is left on its old node, recorded as failed", "rental", m.Rental,
			"tenant", m.Tenant, "node", m.FromNode, "err", err)
		f.d.Metrics.moveFailed(ctx, shizuv1.MigrationReason(m.Reason).String())
		m.Failed = err.Error()
		failed = append(failed, m)
	}
	// Everything a move publishes is built first, so a move that cannot be
	// published is dropped before its allocation is released.
	type prepared struct {
		m    migration
		subj string
		ev   *shizuv1.RentalMigrating
	}
	var ready []prepared
	for _, m := range ms {
		subj, err := subject.Format(subject.RentalMigrating, m.Tenant)
		if err == nil && m.StopOld && m.FromAttempt > 0 {
			_, err = subject.Format(subject.AgentCmd, m.FromNode, "stop")
		}
		if err != nil {
			fail(m, fault.Invalid("%v", err))
			continue
		}
		ready = append(ready, prepared{m: m, subj: subj})
	}
	ids := make([]string, len(ready))
	for i, p := range ready {
		ids[i] = p.m.Rental
	}
	placements, err := f.rec.placementsOf(ctx, ids)
	if err != nil {
		return err
	}
	breaks := map[string][]string{} // node -> rentals whose allocation there is released
	var out []prepared
	var gone []string
	for _, p := range ready {
		m := p.m
		switch m.Mode {
		case modeBreak:
			breaks[m.FromNode] = append(breaks[m.FromNode], m.Rental)
		case modeMakeBeforeBreak:
			// The old run keeps its allocation (out of the rental index)
			// until it stops, so the new attempt can be reserved next to it.
			_, err := f.d.Store.HandOver(ctx, m.Rental, m.FromNode)
			switch {
			case err == nil, capacity.IsConflict(err): // handed over, or the rental lives elsewhere already
			case capacity.IsNotFound(err):
				gone = append(gone, m.Rental) // it stopped meanwhile: nothing to move
				continue
			case fault.IsInvalid(err):
				fail(m, err)
				continue
			default:
				return err
			}
		}
		if m.StopOld && m.FromAttempt > 0 {
			if err := f.stopRun(ctx, b, m, shizuv1.ExitReason_EXIT_REASON_NODE_FAILED); err != nil {
				if fault.IsInvalid(err) { // its subject was checked above: only the event itself
					fail(m, err)
					continue
				}
				return err
			}
		}
		out = append(out, p)
	}
	for node, rentals := range breaks {
		if _, err := f.d.Store.ReleaseOn(ctx, node, rentals...); err != nil {
			return err
		}
	}
	published := make([]migration, 0, len(out))
	for _, p := range out {
		m := p.m
		id := fmt.Sprintf("rental:%s:migrating:%d", m.Rental, m.NextAttempt)
		if m.NextAttempt == 0 {
			id = fmt.Sprintf("rental:%s:migrating:%s:%d", m.Rental, m.FromNode, m.FromEpoch)
		}
		ev := &shizuv1.RentalMigrating{
			Meta:     f.meta(id, m.Cause, m.Rental, m.DecidedAt),
			RentalId: m.Rental, TenantId: m.Tenant, FromNodeId: m.FromNode, FromNodeEpoch: int64(m.FromEpoch),
			Reason: shizuv1.MigrationReason(m.Reason), LastHeartbeatAt: tsOrNil(m.LastBeat),
			FromAttempt: m.FromAttempt, NextAttempt: m.NextAttempt,
		}
		if pl, known := placements[m.Rental]; known { // the spec is the same for every attempt
			ev.Spec = pl.Spec
			ev.CheckpointUri = pl.Spec.GetCheckpointUri()
		} else {
			f.d.Log.ErrorContext(ctx, "moving a rental failover never saw scheduled; the scheduler gets no spec", "rental", m.Rental)
		}
		if err := b.Publish(ctx, p.subj, ev); err != nil {
			if fault.IsInvalid(err) {
				fail(m, err)
				continue
			}
			return err
		}
		published = append(published, m)
	}
	// The failed are recorded before the wait: a bus failure there must not
	// send them back to the sweep.
	if err := f.rec.updateMigrations(ctx, failed); err != nil {
		return err
	}
	if _, err := b.Wait(ctx); err != nil {
		return err
	}
	for i := range published {
		f.d.Metrics.migrating(ctx, shizuv1.MigrationReason(published[i].Reason).String())
		published[i].Published = true
	}
	if err := f.rec.updateMigrations(ctx, published); err != nil {
		return err
	}
	for _, id := range gone {
		if err := f.rec.dropMigration(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// stopRun tells the old node's agent to stop the moved rental's old run;
// the command goes into b.
func (f *Failover) stopRun(ctx context.Context, b *bus.Batch, m migration, reason shizuv1.ExitReason) error {
	subj, err := subject.Format(subject.AgentCmd, m.FromNode, "stop")
	if err != nil {
		return fault.Invalid("%v", err)
	}
	return b.Publish(ctx, subj, &shizuv1.StopRental{
		Meta:     f.meta(fmt.Sprintf("cmd:stop:%s:%d", m.Rental, m.FromAttempt), m.Cause, m.Rental, f.d.Now()),
		RentalId: m.Rental, TenantId: m.Tenant, NodeId: m.FromNode, Attempt: m.FromAttempt,
		Reason: reason, GracePeriod: durationpb.New(f.cfg.StopGrace),
	})
}

// onHealth: a failed GPU moves the rentals on it; a failed node is lost.
func (f *Failover) onHealth(ctx context.Context, ev *shizuv1.NodeHealthChanged, d bus.Delivery) error {
	if ev.GetHealth() != shizuv1.Health_HEALTH_FAILED {
		return nil // degraded GPUs take no new work: the scheduler's concern
	}
	now := f.d.Now()
	node, epoch := ev.GetNodeId(), uint64(ev.GetEpoch())
	if ev.GetGpuIndex() < 0 {
		f.mu.Lock()
		f.det.Failed(node, epoch, now)
		f.mu.Unlock()
		// Act here, before the ack, so a replica that dies now does not
		// lose the failure; the detector's own report then finds it fenced.
		// The node is alive until the failure it reports: that is when its
		// rentals stopped running.
		at := ev.GetMeta().GetOccurredAt().AsTime()
		b := f.d.Bus.NewBatch()
		if err := f.lose(ctx, detect.Loss{Node: node, Epoch: epoch, Reason: detect.ReasonFatalHealth,
			LastBeat: at, SuspectedAt: at, ConfirmedAt: now}, b); err != nil {
			return err
		}
		_, err := b.Wait(ctx)
		return err
	}
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
	var onGPU []capacity.Allocation
	for _, a := range st.Allocations {
		for _, g := range a.GPUs {
			if g.Index == int(ev.GetGpuIndex()) {
				onGPU = append(onGPU, a)
				break
			}
		}
	}
	f.d.Log.InfoContext(ctx, "GPU failed; moving its rentals", "node", node, "gpu", ev.GetGpuIndex(), "rentals", len(onGPU))
	at := ev.GetMeta().GetOccurredAt().AsTime()
	return f.queueMoves(ctx, onGPU, moveOrder{node: node, epoch: epoch,
		reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_UNHEALTHY, mode: modeBreak, stopOld: true,
		lastAlive: at, decided: now, cause: d.MsgID})
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
	return f.queueMoves(ctx, allocs, moveOrder{node: node, epoch: epoch,
		reason: shizuv1.MigrationReason_MIGRATION_REASON_SPOT_INTERRUPTION, mode: modeMakeBeforeBreak,
		decided: f.d.Now(), cause: d.MsgID})
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
	if err := f.rec.putQuarantine(ctx, node, quarantine{Epoch: epoch, Until: q.Until}); err != nil {
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
	return f.rec.dropQuarantine(ctx, node)
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
	if err := f.rec.putPlacement(ctx, ev.GetRentalId(), placement{Attempt: ev.GetAttempt(), Tenant: ev.GetTenantId(),
		Node: ev.GetNodeId(), Spec: ev.GetSpec()}); err != nil {
		return err
	}
	m, ok, err := f.rec.migrationOf(ctx, ev.GetRentalId())
	if err != nil || !ok || m.Scheduled || m.NextAttempt == 0 || ev.GetAttempt() < m.NextAttempt {
		return err
	}
	f.d.Metrics.scheduled(ctx, ev.GetMeta().GetOccurredAt().AsTime().Sub(m.DecidedAt))
	m.Scheduled = true
	return f.rec.putMigration(ctx, m)
}

// onStarted completes a migration: the new attempt runs. A
// make-before-break move stops the old run now.
func (f *Failover) onStarted(ctx context.Context, ev *shizuv1.RentalStarted, d bus.Delivery) error {
	m, ok, err := f.rec.migrationOf(ctx, ev.GetRentalId())
	if err != nil || !ok {
		return err
	}
	// A start of the next attempt completes the move even if this replica
	// has not marked it handed over yet: the scheduler placed that attempt
	// because of the RentalMigrating, whose ack this start overtook.
	if m.NextAttempt == 0 || ev.GetAttempt() < m.NextAttempt {
		return nil // the old run's start
	}
	if m.Mode == modeMakeBeforeBreak && m.FromAttempt > 0 {
		b := f.d.Bus.NewBatch()
		if err := f.stopRun(ctx, b, m, shizuv1.ExitReason_EXIT_REASON_MIGRATED); err != nil {
			return err
		}
		if _, err := b.Wait(ctx); err != nil {
			return err
		}
	}
	started := ev.GetStartedAt().AsTime()
	down := migrate.Downtime(m.LastAlive, started)
	subj, err := subject.Format(subject.RentalMigrated, m.Tenant)
	if err != nil {
		return fault.Invalid("%v", err)
	}
	ckpt := ""
	if p, known, err := f.rec.placementOf(ctx, m.Rental); err != nil {
		return err
	} else if known {
		ckpt = p.Spec.GetCheckpointUri()
	}
	if _, err := f.d.Bus.Publish(ctx, subj, &shizuv1.RentalMigrated{
		Meta:     f.meta(fmt.Sprintf("rental:%s:migrated:%d", m.Rental, ev.GetAttempt()), d.MsgID, m.Rental, f.d.Now()),
		RentalId: m.Rental, TenantId: m.Tenant, FromNodeId: m.FromNode, ToNodeId: ev.GetNodeId(),
		ToNodeEpoch: ev.GetNodeEpoch(), Downtime: durationpb.New(down), CheckpointUri: ckpt,
	}); err != nil {
		return err
	}
	f.d.Metrics.migrated(ctx, shizuv1.MigrationReason(m.Reason).String(), down)
	return f.rec.dropMigration(ctx, m.Rental)
}

// onStopped frees the allocation of a run handed over by a
// make-before-break move once that run stopped (the scheduler frees only
// a rental's live allocation), and forgets a rental whose latest run
// ended.
func (f *Failover) onStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	if _, err := f.d.Store.ReleaseHandedOver(ctx, ev.GetNodeId(), ev.GetRentalId()); err != nil {
		return err
	}
	return f.rec.forgetPlacement(ctx, ev.GetRentalId(), ev.GetAttempt())
}

// sweep recovers from a replica that died mid-way: a dead node whose
// allocations nobody released, migrations recorded but never handed over
// (not those recorded as failed: they would fail again), quarantines past
// their end.
func (f *Failover) sweep(ctx context.Context) error {
	now := f.d.Now()
	ids, err := f.rec.migrations(ctx)
	if err != nil {
		return err
	}
	recorded, err := f.rec.migrationsOf(ctx, ids)
	if err != nil {
		return err
	}
	var stale []migrate.Move
	for _, id := range ids {
		m, ok := recorded[id]
		if !ok || m.Published || m.Failed != "" || now.Sub(m.DecidedAt) < f.cfg.Sweep {
			continue
		}
		stale = append(stale, migrate.Move{Rental: m.Rental, Tenant: m.Tenant, Node: m.FromNode, GPUs: m.GPUs,
			Class: migrate.Class(m.Class), Priority: m.Priority, Since: m.DecidedAt, Value: m})
	}
	snap, err := f.d.Store.Snapshot(ctx)
	if err != nil {
		return err
	}
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		if n.Status != capacity.StatusDead || len(n.Allocations) == 0 {
			continue
		}
		rentals := make([]string, len(n.Allocations))
		for j, a := range n.Allocations {
			rentals[j] = a.RentalID
		}
		moving, err := f.rec.migrationsOf(ctx, rentals)
		if err != nil {
			return err
		}
		var orphans []capacity.Allocation
		for _, a := range n.Allocations {
			// Orphaned: no move recorded, or the recorded one is off
			// another node (the rental moved here, then this node died).
			if m, ok := moving[a.RentalID]; !ok || m.FromNode != n.ID {
				orphans = append(orphans, a)
			}
		}
		if len(orphans) > 0 {
			if err := f.queueMoves(ctx, orphans, moveOrder{node: n.ID, epoch: n.Epoch - 1,
				reason: shizuv1.MigrationReason_MIGRATION_REASON_NODE_LOST, mode: modeBreak, decided: now,
				cause: fmt.Sprintf("node:%s:lost:%d", n.ID, n.Epoch-1)}); err != nil {
				return err
			}
		}
	}
	f.mu.Lock()
	f.queue.Push(stale...)
	f.mu.Unlock()
	// A node that stopped beating while no replica watched (or before this
	// one started) left no expiry to see: a live node without a key is
	// suspect. Stamped one TTL back, so any beat of the last TTL, even one
	// the watch delivers late, clears the suspicion.
	ttl := f.d.Heartbeats.TTL()
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
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
	qs, err := f.rec.quarantines(ctx)
	if err != nil {
		return err
	}
	for node, q := range qs {
		if !now.Before(q.Until) {
			if err := f.unquarantine(ctx, node, q.Epoch); err != nil {
				return err
			}
		}
	}
	return nil
}
