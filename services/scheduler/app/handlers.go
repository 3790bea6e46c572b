package app

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Bus deliveries: each handler turns an event into jobs for the loop, or
// into records and events of its own.

// onRequested takes a request delivered on its own (see onBatch).
func (s *Scheduler) onRequested(ctx context.Context, d bus.Delivery) error {
	j, err := s.admit(ctx, d)
	if j == nil {
		return err
	}
	errs := []error{nil}
	jobs, _ := s.claimOwners(ctx, []*job{j}, []int{0}, errs)
	if len(jobs) == 0 {
		return errs[0]
	}
	return s.await(ctx, jobs)[0]
}

// admit decodes a request and decides on it before any round
// (round.Admit): a spec that fails validation is rejected at once with the
// reason, and admit returns no job and the error that decides the delivery
// (a request that does not decode or whose envelope is unusable is
// dead-lettered, and rejected when its rental id can be read: unusable);
// anything else becomes a job for the next round.
func (s *Scheduler) admit(ctx context.Context, d bus.Delivery) (*job, error) {
	ev := &shizuv1.RentalRequested{}
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return nil, s.unusable(ctx, d, rentalIDOf(d.Data), fault.Invalid("decode RentalRequested: %w", err))
	}
	r := requestOf(ev)
	reject, err := round.Admit(ev, &r, s.catalogue, s.plan)
	switch {
	case err != nil:
		return nil, s.unusable(ctx, d, ev.GetRentalId(), err)
	case reject != "":
		if owned, err := s.ownsRequest(ctx, ev); !owned {
			return nil, err
		}
		return nil, s.rejectNow(ctx, ev, 1, shizuv1.RejectReason_REJECT_REASON_INVALID_SPEC, reject)
	}
	if refused, err := s.refuseOverBudget(ctx, ev); refused {
		return nil, err
	}
	return s.newJob(ev, r, 1), nil
}

// onBatch handles a batch of deliveries of one consumer: its requests go
// to the loop together (one round places them all, or a few rounds when
// the loop merges batches), every other event to its handler in the
// router, concurrently. Each delivery's outcome is its handler's error,
// or for a request nil once its outcome is published.
//
// Acking a batch together keeps every guarantee of acking one by one: a
// request is acknowledged only after its outcome is recorded (SET NX) and
// its events are stored, and a redelivery (an ack lost in a crash) finds
// the recorded outcome and the store's idempotent reserve, so it
// republishes the same events under the same ids, which the stream
// deduplicates.
func (s *Scheduler) onBatch(router *bus.Router) bus.BatchHandlerFunc {
	requested := bus.EventName(&shizuv1.RentalRequested{})
	return func(ctx context.Context, ds []bus.Delivery) []error {
		errs := make([]error, len(ds))
		jobs := make([]*job, 0, len(ds))
		at := make([]int, 0, len(ds))
		var others sync.WaitGroup
		for i, d := range ds {
			event, h := router.Lookup(d)
			switch {
			case event == requested:
				j, err := s.admit(ctx, d)
				if j == nil {
					errs[i] = err
					continue
				}
				jobs, at = append(jobs, j), append(at, i)
			case h != nil:
				others.Go(func() { errs[i] = h(ctx, d) })
			}
		}
		jobs, at = s.claimOwners(ctx, jobs, at, errs)
		for k, err := range s.await(ctx, jobs) {
			errs[at[k]] = err
		}
		others.Wait()
		return errs
	}
}

// await hands jobs to the loop and returns each one's outcome once it is
// published.
func (s *Scheduler) await(ctx context.Context, jobs []*job) []error {
	errs := make([]error, len(jobs))
	if len(jobs) == 0 {
		return errs
	}
	select {
	case s.in <- jobs:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	for i, j := range jobs {
		select {
		case errs[i] = <-j.done:
		case <-ctx.Done():
			errs[i] = ctx.Err()
		}
	}
	return errs
}

// submit hands one request to the next scheduling round and waits until
// its outcome is published.
func (s *Scheduler) submit(ctx context.Context, ev *shizuv1.RentalRequested, r placement.Request, attempt int32) error {
	return s.await(ctx, []*job{s.newJob(ev, r, attempt)})[0]
}

// rejectNow records and publishes a rejection for a request that never
// reached a round.
func (s *Scheduler) rejectNow(ctx context.Context, ev *shizuv1.RentalRequested, attempt int32, reason shizuv1.RejectReason, msg string) error {
	got, err := s.rec.Claim(ctx, []string{ports.AttemptKey(ev.GetRentalId(), attempt)}, round.OutcomeRejected, nil, nil)
	if err != nil {
		return err
	}
	if got[0].Outcome != round.OutcomeRejected {
		return nil // already decided otherwise
	}
	if err := s.freeHeld(ctx, ev.GetRentalId()); err != nil {
		return err
	}
	b := s.pub.NewBatch()
	if err := s.queueRejected(ctx, b, ev, reason, msg); err != nil {
		return err
	}
	err = b.Wait(ctx)
	s.metrics.outcome(ctx, "rejected")
	return err
}

// onCancel ends a rental the tenant cancelled: not placed yet, it is
// rejected (REJECT_REASON_CANCELLED); placed, its node agent is told to
// stop it, and its capacity comes back with RentalStopped. A cancel of
// another tenant's rental is rejected (ownsCancel) and changes nothing.
func (s *Scheduler) onCancel(ctx context.Context, ev *shizuv1.RentalCancelRequested, _ bus.Delivery) error {
	if owns, err := s.ownsCancel(ctx, ev); !owns {
		return err
	}
	got, err := s.rec.Claim(ctx, []string{ev.GetRentalId()}, round.OutcomeCancelled, nil, nil)
	if err != nil {
		return err
	}
	b := s.pub.NewBatch()
	switch got[0].Outcome {
	case round.OutcomeCancelled:
		// A reservation made for it and not recorded (a replica died
		// between the two, or is between them now) ends with it; a
		// replica still in flight loses its claim and gives back nothing.
		if err := s.freeHeld(ctx, ev.GetRentalId()); err != nil {
			return err
		}
		if err := s.queueCancelled(ctx, b, ev, "cancelled before it was placed"); err != nil {
			return err
		}
	case round.OutcomeScheduled:
		a, err := s.d.Store.Allocation(ctx, ev.GetRentalId())
		if capacity.IsNotFound(err) {
			// Stopped and released, or between two attempts: failover
			// released the lost run and the next one is not placed yet.
			// Its outcome is claimed as cancelled, so that placement gives
			// its reservation back instead of starting it.
			return s.cancelNextAttempt(ctx, ev)
		}
		if err != nil {
			return err
		}
		attempt, err := s.rec.CurrentAttempt(ctx, ev.GetRentalId())
		if err != nil {
			return err
		}
		if err := s.queueStop(ctx, b, ev, a.NodeID, attempt); err != nil {
			return err
		}
	default:
		return nil // rejected already
	}
	return b.Wait(ctx)
}

// freeHeld gives back whatever the store holds under a rental id whose
// attempt just ended without a placement (cancelled, rejected): a
// reservation whose replica died before it recorded the outcome. It tells
// the loop's view and wakes the pending requests when it freed something.
func (s *Scheduler) freeHeld(ctx context.Context, rental string) error {
	a, err := s.reserve.Allocation(ctx, rental)
	switch {
	case capacity.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case a.HandingOver:
		return nil // the previous run of a moved rental: failover's
	}
	released, err := s.reserve.Release(ctx, rental)
	if err != nil || !released {
		return err
	}
	s.d.Log.InfoContext(ctx, "released a reservation its rental no longer needs", "rental", rental, "node", a.NodeID)
	s.view.Post(view.Fix{Node: a.NodeID, Rental: rental})
	s.wake()
	return nil
}

// cancelNextAttempt records a cancel for the attempt after a rental's
// current one. When the rental was being moved, the tenant hears the
// rental is cancelled; when it had stopped, nothing will ever place that
// attempt and the record only expires.
func (s *Scheduler) cancelNextAttempt(ctx context.Context, ev *shizuv1.RentalCancelRequested) error {
	attempt, err := s.rec.CurrentAttempt(ctx, ev.GetRentalId())
	if err != nil {
		return err
	}
	got, err := s.rec.Claim(ctx, []string{ports.AttemptKey(ev.GetRentalId(), attempt+1)}, round.OutcomeCancelled, nil, nil)
	if err != nil || !got[0].Won {
		return err
	}
	moving, err := s.rec.Placed(ctx, ev.GetRentalId())
	if err != nil || !moving {
		return err
	}
	b := s.pub.NewBatch()
	if err := s.queueCancelled(ctx, b, ev, "cancelled while being moved to another node"); err != nil {
		return err
	}
	return b.Wait(ctx)
}

// onStoppedRaw decodes and validates a RentalStopped as bus.On does, except
// for a stop stamped before its start (an agent whose wall clock stepped
// back during a short run): the run did end, so it is handled as a stop at
// its start (shizuv1.ClampStop) and flagged (a warning and
// shizu.scheduler.clamped_stops) instead of dead-lettered, which would
// keep its GPU allocated forever. Anything else invalid is dead-lettered.
func (s *Scheduler) onStoppedRaw(ctx context.Context, d bus.Delivery) error {
	ev := &shizuv1.RentalStopped{}
	if err := proto.Unmarshal(d.Data, ev); err != nil {
		return fault.Invalid("decode %s: %w", bus.EventName(ev), err)
	}
	clamped := shizuv1.ClampStop(ev)
	if err := ev.Validate(); err != nil {
		return fault.Invalid("validate %s: %w", bus.EventName(ev), err)
	}
	if clamped {
		s.d.Metrics.clampedStop(ctx)
		s.d.Log.WarnContext(ctx, "rental stop stamped before its start (the agent's clock stepped back); its capacity is given back",
			"rental", ev.GetRentalId(), "node", ev.GetNodeId(), "attempt", ev.GetAttempt())
	}
	return s.onStopped(ctx, ev, d)
}

// onStopped gives a stopped rental's capacity back (only the allocation on
// the node that reports the stop: a rental re-placed elsewhere keeps its
// new one), then wakes the pending requests. A stop naming another tenant
// than the rental's owner is dead-lettered (checkOwner).
func (s *Scheduler) onStopped(ctx context.Context, ev *shizuv1.RentalStopped, _ bus.Delivery) error {
	if err := s.checkOwner(ctx, "RentalStopped", ev.GetRentalId(), ev.GetTenantId()); err != nil {
		return err
	}
	a, err := s.d.Store.Allocation(ctx, ev.GetRentalId())
	if capacity.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if a.NodeID != ev.GetNodeId() {
		return nil
	}
	// A rental moved off a failed GPU may land on the same node again: the
	// old run's stop must not release the new placement.
	if newer, err := s.rec.PlacedAfter(ctx, ev.GetRentalId(), max(ev.GetAttempt(), 1)); err != nil {
		return err
	} else if newer {
		return nil
	}
	if _, err := s.d.Store.Release(ctx, ev.GetRentalId()); err != nil {
		return err
	}
	if err := s.rec.Forget(ctx, ev.GetRentalId()); err != nil {
		return err
	}
	s.wake()
	return nil
}

// wake has the loop try the pending set at once.
func (s *Scheduler) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// onHealth records a GPU's reported health in the capacity store, so that
// every replica stops placing on a degraded or failed GPU (the store's
// reserve refuses it too) and places on it again once it is reported
// healthy. A failed node as a whole (gpu_index -1) is failover's: it
// fences the node. Reports about an older registration change nothing.
func (s *Scheduler) onHealth(ctx context.Context, ev *shizuv1.NodeHealthChanged, _ bus.Delivery) error {
	if ev.GetGpuIndex() < 0 {
		return nil
	}
	h, ok := rent.HealthOf(ev.GetHealth())
	if !ok {
		return fault.Invalid("NodeHealthChanged: health %v", ev.GetHealth())
	}
	if ev.GetEpoch() < 1 {
		return fault.Invalid("NodeHealthChanged: epoch %d", ev.GetEpoch())
	}
	changed, err := s.d.Store.SetGPUHealth(ctx, ev.GetNodeId(), uint64(ev.GetEpoch()), int(ev.GetGpuIndex()), h)
	switch {
	case capacity.IsNotFound(err), capacity.IsFenced(err):
		return nil // gone, or about an older registration
	case capacity.IsInvalid(err):
		return fault.Invalid("%w", err)
	case err != nil:
		return err
	}
	if changed {
		s.d.Log.InfoContext(ctx, "GPU health changed", "node", ev.GetNodeId(), "gpu", ev.GetGpuIndex(), "health", string(h))
	}
	select {
	case s.changed <- ev.GetNodeId():
	default: // the loop is busy; the store refuses the GPU meanwhile
	}
	if h == capacity.HealthHealthy && changed {
		s.wake()
	}
	return nil
}
