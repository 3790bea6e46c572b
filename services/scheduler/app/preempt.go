package app

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Preemption, end to end. A round that finds an on-demand or reserved
// request room only by evicting spot rentals claims those victims in the
// records (ports.Preemption, all or none, once per victim: a victim
// already preempted for another rental is never announced again), then
// announces each with RentalPreempted. From then on every view hides the
// victims from later preemption plans, and the preemptor waits for its
// victims instead of picking new ones. Once the notice passed, a replica
// sends each victim's node StopRental (EXIT_REASON_PREEMPTED); the agent
// stops it and reports RentalStopped, whose handling releases the
// capacity, drops the record and wakes the pending requests, so the
// preemptor is placed.

// preemptStopGrace is the grace the victim's agent gives it once the
// notice passed: the notice was the warning.
const preemptStopGrace = time.Second

// claimPreemption claims p's victims for j. It returns false when another
// preemptor holds one of them (the view then hides them too).
func (s *Scheduler) claimPreemption(ctx context.Context, j *job, p *round.Preempt) (bool, error) {
	ps := make([]ports.Preemption, len(p.Victims))
	for i, v := range p.Victims {
		ps[i] = ports.Preemption{Victim: v.RentalID, Tenant: v.Tenant, Preemptor: j.Request.ID, NodeID: p.NodeID,
			NodeEpoch: p.NodeEpoch, Notice: p.NoticeDeadline}
	}
	taken, err := s.rec.ClaimPreemption(ctx, ps)
	if err != nil {
		return false, err
	}
	if len(taken) > 0 {
		s.hideVictims(taken...)
		return false, nil
	}
	s.hideVictims(rentalsOf(ps)...)
	// The view may be older than the store: a victim that stopped (its
	// record dropped with it) can still show there. Claimed, it cannot
	// go away unseen, so its allocation is checked now; a claim with a
	// victim gone is given up and the preemptor plans again.
	gone, err := s.victimsGone(ctx, ps)
	if err != nil || len(gone) > 0 {
		if err == nil {
			err = s.rec.DropPreemption(ctx, rentalsOf(ps)...)
		}
		return false, err
	}
	return true, nil
}

// victimsGone returns the victims of ps no longer allocated on the node
// they were planned on.
func (s *Scheduler) victimsGone(ctx context.Context, ps []ports.Preemption) ([]string, error) {
	var gone []string
	for _, p := range ps {
		a, err := s.reserve.Allocation(ctx, p.Victim)
		switch {
		case capacity.IsNotFound(err) || (err == nil && a.NodeID != p.NodeID):
			gone = append(gone, p.Victim)
		case err != nil:
			return nil, err
		}
	}
	return gone, nil
}

func rentalsOf(ps []ports.Preemption) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Victim
	}
	return out
}

// hideVictims makes preempted rentals no candidates of a later preemption
// plan on the loop's view (a victim is evicted for one preemptor only).
func (s *Scheduler) hideVictims(victims ...string) {
	if len(victims) == 0 {
		return
	}
	hide := make(map[string]bool, len(victims))
	for _, v := range victims {
		hide[v] = true
	}
	hideIn(s.view.Cluster().Nodes, hide)
}

// hideIn marks the allocations of hide in nodes as not preemptible: a
// preemption plan only evicts spot rentals, so they count as on-demand.
func hideIn(nodes []placement.Node, hide map[string]bool) {
	for i := range nodes {
		for k := range nodes[i].Allocations {
			if hide[nodes[i].Allocations[k].RentalID] {
				nodes[i].Allocations[k].Class = rent.ClassOnDemand
			}
		}
	}
}

// preempted reads the preemption records as the victims to hide.
func (s *Scheduler) preempted(ctx context.Context) (map[string]bool, error) {
	ps, err := s.rec.Preemptions(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ps))
	for _, p := range ps {
		out[p.Victim] = true
	}
	return out, nil
}

// awaitVictims keeps the jobs whose victims still run waiting for them:
// their wait is extended past now, so the round neither plans another
// preemption for them nor says anything new.
func (s *Scheduler) awaitVictims(ctx context.Context, jobs []*job) error {
	ps, err := s.rec.Preemptions(ctx)
	if err != nil || len(ps) == 0 {
		return err
	}
	waiting := make(map[string]bool, len(ps))
	for _, p := range ps {
		waiting[p.Preemptor] = true
	}
	now := s.d.Now()
	for _, j := range jobs {
		if waiting[j.Request.ID] && !now.Before(j.PreemptUntil) {
			j.PreemptUntil = now.Add(s.cfg.PreemptionNotice)
			if !j.FromPending {
				j.Reason = shizuv1.PendingReason_PENDING_REASON_AWAITING_PREEMPTION
			}
		}
	}
	return nil
}

// victimStopper runs stopVictims one pass at a time.
type victimStopper struct{ running atomic.Bool }

// stopVictimsSoon starts a stopVictims pass off the loop unless one runs.
func (s *Scheduler) stopVictimsSoon(ctx context.Context) {
	if !s.stopping.running.CompareAndSwap(false, true) {
		return
	}
	s.publishers.Go(func() {
		defer s.stopping.running.Store(false)
		if err := s.stopVictims(ctx); err != nil {
			s.d.Log.WarnContext(ctx, "stop preempted rentals", "err", err)
		}
	})
}

// stopVictims sends the StopRental of every victim whose notice passed
// (once: its record is marked), and drops the records of victims no
// longer on the node they were preempted on (stopped, moved).
func (s *Scheduler) stopVictims(ctx context.Context) error {
	ps, err := s.rec.Preemptions(ctx)
	if err != nil || len(ps) == 0 {
		return err
	}
	now := s.d.Now()
	b := s.pub.NewBatch()
	var sent, gone []string
	for _, p := range ps {
		a, err := s.reserve.Allocation(ctx, p.Victim)
		switch {
		case capacity.IsNotFound(err) || (err == nil && a.NodeID != p.NodeID):
			gone = append(gone, p.Victim)
			continue
		case err != nil:
			return err
		case p.StopSent || now.Before(p.Notice):
			continue
		}
		attempt, err := s.rec.CurrentAttempt(ctx, p.Victim)
		if err != nil {
			return err
		}
		if err := s.publish(ctx, b, subject.AgentCmd, []string{p.NodeID, "stop"}, &shizuv1.StopRental{
			Meta:     shizuv1.NewMeta(fmt.Sprintf("cmd:stop:%s:%d:preempted", p.Victim, attempt), s.source, "", p.Victim, now),
			RentalId: p.Victim, TenantId: p.Tenant, NodeId: p.NodeID, Attempt: attempt,
			Reason: shizuv1.ExitReason_EXIT_REASON_PREEMPTED, GracePeriod: durationpb.New(preemptStopGrace),
		}); err != nil {
			return err
		}
		sent = append(sent, p.Victim)
	}
	if err := s.rec.DropPreemption(ctx, gone...); err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	for _, v := range sent {
		if err := s.rec.StopSent(ctx, v); err != nil {
			return err
		}
		s.d.Log.InfoContext(ctx, "told a preempted rental's node to stop it", "rental", v)
	}
	return nil
}
