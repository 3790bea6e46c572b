package app

import (
	"context"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// maxPublishing is how many rounds may await their acks at once.
const maxPublishing = 4

// Run is the scheduling loop; it returns when ctx ends, once the events of
// every round are acknowledged.
func (s *Scheduler) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.PendingRetry)
	defer tick.Stop()
	reconcile := time.NewTicker(s.cfg.ReconcileInterval)
	defer reconcile.Stop()
	defer s.publishers.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case jobs := <-s.in:
			batch := append(make([]*job, 0, max(len(jobs), s.cfg.BatchSize)), jobs...)
		fill:
			for len(batch) < s.cfg.BatchSize {
				select {
				case jobs := <-s.in:
					batch = append(batch, jobs...)
				default:
					break fill
				}
			}
			for start := 0; start < len(batch); start += s.cfg.BatchSize {
				s.round(ctx, batch[start:min(len(batch), start+s.cfg.BatchSize)])
			}
		case id := <-s.changed:
			if err := s.refreshNode(ctx, id); err != nil {
				s.d.Log.WarnContext(ctx, "refresh node", "node", id, "err", err)
			}
		case <-tick.C:
			s.refreshSpotPrices(ctx)
			s.onWholeRecords(func() {
				s.retryPending(ctx, false)
				s.stopVictimsSoon(ctx)
			})
		case <-reconcile.C:
			s.reconcileSoon(ctx)
			s.onWholeRecords(func() { s.interruptPricedOutSoon(ctx) })
		case <-s.kick:
			s.onWholeRecords(func() { s.retryPending(ctx, true) })
		}
	}
}

// refresh reads the whole store into the view.
func (s *Scheduler) refresh(ctx context.Context) error {
	snap, err := s.d.Store.Snapshot(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for i := range snap.Nodes {
		for _, a := range snap.Nodes[i].Allocations {
			ids = append(ids, a.RentalID)
		}
	}
	classes, err := s.rec.Classes(ctx, ids)
	if err != nil {
		return err
	}
	hide, err := s.preempted(ctx)
	if err != nil {
		return err
	}
	nodes := make([]placement.Node, len(snap.Nodes))
	for i := range snap.Nodes {
		nodes[i] = nodeOf(&snap.Nodes[i], classes)
	}
	round.SetSpotPrices(nodes, s.prices)
	hideIn(nodes, hide)
	s.view.Reset(nodes, snap.Version, s.d.Now())
	s.metrics.fragmentation(s.view.Fragmentation())
	s.metrics.refreshed(ctx)
	return nil
}

// refreshNode re-reads one node after a refused reserve.
func (s *Scheduler) refreshNode(ctx context.Context, id string) error {
	st, err := s.d.Store.Node(ctx, id)
	if capacity.IsNotFound(err) {
		s.view.NodeGone(id)
		return nil
	}
	if err != nil {
		return err
	}
	var ids []string
	for _, a := range st.Allocations {
		ids = append(ids, a.RentalID)
	}
	classes, err := s.rec.Classes(ctx, ids)
	if err != nil {
		return err
	}
	hide, err := s.preempted(ctx)
	if err != nil {
		return err
	}
	nodes := []placement.Node{nodeOf(&st, classes)}
	round.SetSpotPrices(nodes, s.prices)
	hideIn(nodes, hide)
	s.view.SetNode(nodes[0])
	return nil
}

// ensureFresh refreshes the view when the store moved and the view is
// older than SnapshotMaxAge (or at once with force).
func (s *Scheduler) ensureFresh(ctx context.Context, force bool) error {
	if s.view.RefreshedAt().IsZero() {
		return s.refresh(ctx)
	}
	if !force && s.d.Now().Sub(s.view.RefreshedAt()) < s.cfg.SnapshotMaxAge {
		return nil
	}
	v, err := s.d.Store.Version(ctx)
	if err != nil {
		return err
	}
	if v == s.view.Version() {
		return nil
	}
	return s.refresh(ctx)
}

// retryPending runs a round over the pending set when capacity may have
// freed (the store moved) or a deadline may have passed.
func (s *Scheduler) retryPending(ctx context.Context, kicked bool) {
	v, err := s.d.Store.Version(ctx)
	if err != nil {
		s.d.Log.WarnContext(ctx, "read store version", "err", err)
		return
	}
	now := s.d.Now()
	if v == s.lastRetry && !kicked && now.Before(s.nextDeadline) {
		return // nothing freed and no deadline passed: skip reading the set
	}
	entries, bad, err := s.rec.Pending(ctx)
	if err != nil {
		s.d.Log.WarnContext(ctx, "read pending requests", "err", err)
		return
	}
	if len(bad) > 0 {
		s.d.Log.ErrorContext(ctx, "dropping undecodable pending entries", "count", len(bad))
		_ = s.rec.DropPending(ctx, bad...)
	}
	s.lastRetry = v
	s.nextDeadline = now.Add(s.cfg.PendingTimeout)
	var jobs []*job
	for _, e := range entries {
		j := s.pendingJob(e)
		if j.Deadline.Before(s.nextDeadline) {
			s.nextDeadline = j.Deadline
		}
		if !e.PreemptUntil.IsZero() && now.Before(e.PreemptUntil) && e.PreemptUntil.Before(s.nextDeadline) {
			s.nextDeadline = e.PreemptUntil
		}
		jobs = append(jobs, j)
	}
	if now.Before(s.plan.JudgeFrom) && s.plan.JudgeFrom.Before(s.nextDeadline) {
		s.nextDeadline = s.plan.JudgeFrom // judge the unsatisfiable ones once the grace ends
	}
	for start := 0; start < len(jobs); start += s.cfg.BatchSize {
		s.round(ctx, jobs[start:min(len(jobs), start+s.cfg.BatchSize)])
	}
}

// pendingJob is the job that retries a pending entry: its request as it
// was first placed (a moved rental's preferred model included).
func (s *Scheduler) pendingJob(e ports.PendingEntry) *job {
	r := requestOf(e.Event)
	r.PreferredModels = e.PreferredModels
	j := &job{Job: round.NewJob(e.Event, r, max(e.Attempt, 1), s.plan), done: make(chan error, 1)}
	j.FromPending, j.PreemptUntil, j.Reason = true, e.PreemptUntil, e.Reason
	return j
}

// round runs round.Plan over a batch: order the requests (level one),
// place each on the view (level two), commit the reservations in parallel
// as they are placed, re-place the refused ones on fresh node state, then
// record the outcomes and publish. Each job's done gets nil once its
// outcome is published, or the error that should redeliver it.
func (s *Scheduler) round(ctx context.Context, batch []*job) {
	start := s.d.Now()
	s.view.ApplyFixes()
	if err := s.ensureFresh(ctx, false); err != nil {
		// A rental asked for twice in one round (a redelivery) is placed
		// once; its copies follow in a round of their own.
		first, again := round.FirstOfEach(batch)
		finish(first, err)
		if len(again) > 0 {
			s.round(ctx, again)
		}
		return
	}
	s.decide(ctx, batch, start, &roundCommit{s: s, ctx: ctx})
}

// decide runs round.Plan over a batch at now with the commit c, then
// records and publishes what it decided.
func (s *Scheduler) decide(ctx context.Context, batch []*job, now time.Time, c round.Commit[*job]) {
	plan := round.Plan(s.view, batch, now, s.plan, c)
	for _, f := range plan.Invalid {
		f.Job.err = fault.Invalid("%w", f.Err)
	}
	for _, j := range plan.Refused { // still refused after MaxPasses: try again later
		j.err = fault.Unavailable("placement of %s refused %d times; retrying", j.Request.ID, round.MaxPasses)
	}
	s.finishRound(ctx, &plan, now)
	s.metrics.fragmentation(s.view.Fragmentation())
	// The repeats' round finds this one's reservation and its recorded
	// outcome.
	if len(plan.Again) > 0 {
		s.round(ctx, plan.Again)
	}
}

func finish(jobs []*job, err error) {
	for _, j := range jobs {
		j.done <- err
	}
}
