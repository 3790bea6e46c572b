package app

import (
	"context"
	"sync"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// commitChunk is how many reserves one pipeline carries.
const commitChunk = 64

// committer reserves chunks of placed jobs through the Reserver while the
// loop places the next ones: each chunk is one ReserveMany pipeline (its
// reserves run in round order), up to CommitWorkers pipelines at once.
// The loop must not touch a sent job's alloc or err until wait
// returns.
type committer struct {
	reserver ports.Reserver
	quotas   ports.Quotas
	ctx      context.Context
	chunks   chan []*job
	workers  int
	most     int
	wg       sync.WaitGroup
}

func (s *Scheduler) startCommit(ctx context.Context) *committer {
	return &committer{reserver: s.reserve, quotas: s.d.Quotas, ctx: ctx, most: s.cfg.CommitWorkers,
		chunks: make(chan []*job, s.cfg.BatchSize/commitChunk+1)}
}

// send queues a chunk, starting a worker while fewer than CommitWorkers
// run.
func (c *committer) send(chunk []*job) {
	if len(chunk) == 0 {
		return
	}
	if c.workers < c.most {
		c.workers++
		c.wg.Go(c.work)
	}
	c.chunks <- chunk
}

func (c *committer) work() {
	ps := make([]capacity.Placement, 0, commitChunk)
	for chunk := range c.chunks {
		ps = ps[:0]
		for _, j := range chunk {
			p := placementOf(&j.Request, j.Placed)
			// The store keeps the attempt: of a rental two nodes restore
			// after a lost Redis, the later attempt stays.
			p.Attempt = max(j.Attempt, 1)
			if c.quotas != nil {
				p.Quota = c.quotas.Quota(p.Tenant)
			}
			ps = append(ps, p)
		}
		for i, r := range c.reserver.ReserveMany(c.ctx, ps) {
			chunk[i].alloc, chunk[i].err = r.Allocation, r.Err
		}
	}
}

// wait returns once every sent chunk is reserved (or refused).
func (c *committer) wait() {
	close(c.chunks)
	c.wg.Wait()
}

// roundCommit is round.Plan's Commit for the live loop: it reserves the
// placed jobs through the Reserver, a chunk of commitChunk placements
// reserved while the next chunk is being placed, and reads the store and
// the records for the round.
type roundCommit struct {
	s      *Scheduler
	ctx    context.Context
	cm     *committer
	commit []*job
	chunk  int
}

// Reserve queues a placed job, sending a chunk once it is full.
func (c *roundCommit) Reserve(j *job) {
	if c.cm == nil {
		c.cm, c.commit, c.chunk = c.s.startCommit(c.ctx), c.commit[:0], 0
	}
	c.commit = append(c.commit, j)
	if len(c.commit)-c.chunk == commitChunk {
		c.cm.send(c.commit[c.chunk:])
		c.chunk = len(c.commit)
	}
}

// Settle reserves the rest and returns the jobs whose reserve the store
// refused (capacity taken, a fenced or gone node); a transient failure
// keeps its error, to be redelivered.
func (c *roundCommit) Settle() []*job {
	if c.cm == nil {
		return nil
	}
	c.cm.send(c.commit[c.chunk:])
	c.cm.wait()
	c.cm = nil
	var refused []*job
	for _, j := range c.commit {
		if overQuota(j) {
			refused = append(refused, j)
			continue
		}
		if capacity.IsInsufficient(j.err) || capacity.IsFenced(j.err) || capacity.IsConflict(j.err) || capacity.IsNotFound(j.err) {
			c.s.metrics.conflict(c.ctx)
			j.err = nil
			refused = append(refused, j)
		}
	}
	return refused
}

// Refresh re-reads the stale nodes and, with whole, the whole view when
// the store moved.
func (c *roundCommit) Refresh(whole bool) bool {
	s, ctx := c.s, c.ctx
	for _, id := range s.view.TakeStale() {
		if err := s.refreshNode(ctx, id); err != nil {
			s.d.Log.WarnContext(ctx, "refresh node", "node", id, "err", err)
		}
	}
	if !whole {
		return false
	}
	v, err := s.d.Store.Version(ctx)
	return err == nil && v != s.view.Version() && s.refresh(ctx) == nil
}

// Decided reads whether an outcome is recorded for the jobs' attempts (a
// duplicate delivery of a rental scheduled, rejected or cancelled
// meanwhile).
func (c *roundCommit) Decided(jobs []*job) error {
	keys := make([]string, len(jobs))
	for i, j := range jobs {
		keys[i] = ports.AttemptKey(j.Request.ID, j.Attempt)
	}
	decided, err := c.s.rec.Decided(c.ctx, keys)
	if err != nil {
		return err
	}
	for i, j := range jobs {
		j.Decided = decided[i]
	}
	c.adopt(jobs)
	c.s.checkQuotas(c.ctx, jobs)
	return c.s.awaitVictims(c.ctx, jobs)
}

// adopt takes, for each undecided job that fits nowhere, the reservation
// the store already holds under its rental id as its placement: a replica
// reserved it and died before it recorded the outcome (or an earlier round
// of this replica is still recording it), and this redelivery would
// otherwise wait for capacity its own reservation holds. An adopted job
// is Decided for the round (it says nothing about it) and is recorded as
// scheduled with the placed ones (finishRound); its claim keeps the
// reservation only when it names this very allocation or wins.
func (c *roundCommit) adopt(jobs []*job) {
	want := map[string]*job{}
	for _, j := range jobs {
		if !j.Decided {
			want[j.Request.ID] = j
		}
	}
	if len(want) == 0 {
		return
	}
	cl := c.s.view.Cluster()
	for i := range cl.Nodes {
		for _, a := range cl.Nodes[i].Allocations {
			j, ok := want[a.RentalID]
			if !ok {
				continue
			}
			delete(want, a.RentalID)
			held, err := c.s.reserve.Allocation(c.ctx, a.RentalID)
			if err != nil || held.HandingOver {
				continue // gone meanwhile, or unreadable: decided as no fit
			}
			held.Existing = true
			j.alloc, j.adopted, j.Decided = held, true, true
			j.Placed = placement.Placement{NodeID: held.NodeID, Epoch: held.Epoch}
		}
	}
}

// finishRound publishes what the round's plan decided for the requests
// that found no room (on the loop: it reads the view), then records the
// placed ones' outcomes and publishes off the loop, so the next round
// places while this one's outcomes are being recorded and its events
// stored; at most maxPublishing rounds at once. What that finds about the
// view (a reservation given back, one recorded elsewhere) comes back as
// fixes.
func (s *Scheduler) finishRound(ctx context.Context, plan *round.RoundPlan[*job], now time.Time) {
	b := s.pub.NewBatch()
	var ok []*job
	for _, j := range plan.Reserve {
		if j.err == nil {
			j.facts = s.view.Facts(j.alloc.NodeID)
			ok = append(ok, j)
		}
	}
	for _, j := range plan.NoFit.Jobs {
		if j.adopted && j.err == nil {
			j.facts = s.view.Facts(j.alloc.NodeID)
			ok = append(ok, j)
		}
	}
	s.handleNoFit(ctx, b, &plan.NoFit, now)
	// Rounds record their outcomes in the order they placed: a repeat of
	// a request placed one round earlier finds that reservation (Existing)
	// and must find its outcome recorded too, or it would take the
	// outcome and the earlier round, seeing the outcome taken by another,
	// would give back the one reservation both announce.
	prev, mine := s.claimed, make(chan struct{})
	s.claimed = mine
	s.publishing <- struct{}{}
	all := plan.Order
	s.publishers.Go(func() {
		defer func() { <-s.publishing }()
		if prev != nil {
			<-prev
		}
		var fixes []view.Fix
		if err := s.failpoint(ok); err != nil {
			for _, j := range ok {
				j.err = err
			}
		} else {
			fixes = s.recordScheduled(ctx, b, ok, now)
		}
		close(mine)
		s.view.Post(fixes...)
		err := b.Wait(ctx)
		for _, j := range all {
			if j.err == nil {
				j.err = err
			}
			if j.err != nil && !fault.IsInvalid(j.err) {
				s.d.Log.WarnContext(ctx, "scheduling failed; the request is retried", "rental", j.Request.ID, "err", j.err)
			}
			if j.outcome == round.OutcomeScheduled && j.err == nil {
				s.metrics.latency(ctx, j, s.d.Now())
			}
			j.done <- j.err
		}
	})
}

// failpoint runs the afterReserve test hook over the reserved jobs.
func (s *Scheduler) failpoint(ok []*job) error {
	if s.afterReserve == nil || len(ok) == 0 {
		return nil
	}
	ids := make([]string, len(ok))
	for i, j := range ok {
		ids[i] = j.Request.ID
	}
	return s.afterReserve(ids)
}

// recordScheduled records the outcome of reserved requests and queues
// their events. Where another replica or a cancel decided first
// (round.KeepReservation), it gives the capacity back. It runs off the
// loop: it reads only the jobs and their facts, and returns the fixes for
// the loop's view.
func (s *Scheduler) recordScheduled(ctx context.Context, b ports.Batch, ok []*job, now time.Time) []view.Fix {
	if len(ok) == 0 {
		return nil
	}
	ids := make([]string, len(ok))
	allocs := make([]string, len(ok))
	classes := make([]ports.Class, len(ok))
	for i, j := range ok {
		ids[i], allocs[i], classes[i] = ports.AttemptKey(j.Request.ID, j.Attempt), ports.AllocToken(j.alloc), ports.Class{Class: j.Request.Class, Priority: j.Request.Priority, MaxSpotPrice: j.Request.MaxSpotPrice}
	}
	outcomes, err := s.rec.Claim(ctx, ids, round.OutcomeScheduled, allocs, classes)
	if err != nil {
		for _, j := range ok {
			j.err = err
		}
		return nil
	}
	var fixes []view.Fix
	for i, j := range ok {
		j.outcome = outcomes[i].Outcome
		if !round.KeepReservation(outcomes[i], allocs[i], j.alloc.Existing) {
			j.outcome = ""
			if _, rerr := s.reserve.Release(ctx, j.Request.ID); rerr != nil {
				j.err = rerr
			}
			fixes = append(fixes, view.Fix{Node: j.Placed.NodeID, Rental: j.Request.ID})
			continue
		}
		if j.alloc.Existing {
			// Placed before (a redelivery, or another replica): publish
			// what the store recorded; the view is fixed on next refresh.
			fixes = append(fixes, view.Fix{Node: j.Placed.NodeID, Rental: j.Request.ID, Stale: j.alloc.NodeID})
		}
		sched := scheduledOf(j.Event, j.alloc, j.facts, max(j.Attempt, 1), s.source, now)
		if j.err = s.queueScheduled(ctx, b, sched); j.err != nil {
			continue
		}
		if outcomes[i].Won { // a redelivery publishes again but is not a new outcome
			s.metrics.outcome(ctx, "scheduled")
		}
	}
	return fixes
}

// handleNoFit records and publishes what round.Plan decided for the
// requests that fit nowhere: a request decided already says nothing; the
// waiting ones are stored in the pending set with their preemptions and
// shortages published; the expired ones are rejected.
func (s *Scheduler) handleNoFit(ctx context.Context, b ports.Batch, plan *round.NoFit[*job], now time.Time) {
	for _, f := range plan.Failed {
		f.Job.err = f.Err
	}
	if !plan.NextDeadline.IsZero() && (s.nextDeadline.IsZero() || plan.NextDeadline.Before(s.nextDeadline)) {
		s.nextDeadline = plan.NextDeadline
	}
	pending := make([]ports.PendingEntry, 0, len(plan.Pending))
	for _, p := range plan.Pending {
		j := p.Job
		if p.Preempt != nil {
			won, err := s.claimPreemption(ctx, j, p.Preempt)
			switch {
			case err != nil:
				j.err = err
				continue
			case won:
				if err := s.queuePreemption(ctx, b, j, p.Preempt, now); err != nil {
					j.err = err
					continue
				}
			default:
				// Its victims were preempted for another rental first: it
				// waits for capacity and plans again on the next retry,
				// where the view hides those victims.
				p.Preempt, p.Reason, p.PreemptUntil = nil, shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY, j.PreemptUntil
				s.nextDeadline = now
				if j.FromPending && j.Reason == p.Reason {
					continue // nothing new to say
				}
			}
		}
		pending = append(pending, ports.PendingEntry{Event: j.Event, Reason: p.Reason, PreemptUntil: p.PreemptUntil, Attempt: j.Attempt,
			PreferredModels: j.Request.PreferredModels})
		if err := s.queuePending(ctx, b, p, now); err != nil {
			j.err = err
			continue
		}
		s.metrics.outcome(ctx, "pending")
	}
	if err := s.rec.PutPending(ctx, pending); err != nil {
		for _, j := range plan.Jobs {
			j.err = err
		}
		return
	}
	s.rejectExpired(ctx, b, plan.Reject)
}

// rejectExpired claims the rejection of requests whose deadline passed
// and queues the RentalRejected of each one it wins.
func (s *Scheduler) rejectExpired(ctx context.Context, b ports.Batch, rejects []round.Reject[*job]) {
	if len(rejects) == 0 {
		return
	}
	ids := make([]string, len(rejects))
	for i, r := range rejects {
		ids[i] = ports.AttemptKey(r.Job.Request.ID, r.Job.Attempt)
	}
	got, err := s.rec.Claim(ctx, ids, round.OutcomeRejected, nil, nil)
	if err != nil {
		for _, r := range rejects {
			r.Job.err = err
		}
		return
	}
	for i, r := range rejects {
		if got[i].Outcome != round.OutcomeRejected {
			continue
		}
		if err := s.freeHeld(ctx, r.Job.Request.ID); err != nil {
			r.Job.err = err
			continue
		}
		r.Job.err = s.queueRejected(ctx, b, r.Job.Event, r.Reason, r.Message)
		s.metrics.outcome(ctx, "rejected")
	}
}
