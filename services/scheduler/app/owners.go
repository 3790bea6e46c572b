package app

import (
	"context"
	"fmt"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/history"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Rental ownership. A rental id is chosen by its requester, and every
// record of the scheduler (outcomes, the pending set, the store's
// allocations) is keyed by it alone, so the first tenant to use an id owns
// it (ports.Owners): another tenant's request under it is rejected
// (REJECT_REASON_NOT_PERMITTED, on the requester's own subject) before it
// reaches a round, which would hand back the owner's placement; another
// tenant's cancel is rejected the same way, and a stop or move naming
// another tenant is dead-lettered.

// notOwned is what a tenant hears when it uses a rental id another tenant
// owns. It does not say which tenant does.
func notOwned(rental string) string {
	return fmt.Sprintf("rental id %s is already used by another tenant; choose another rental id", rental)
}

// claimOwners keeps the jobs whose tenant owns their rental id (claiming
// the ids not owned yet) and answers the others with a rejection; errs[at[k]]
// gets the outcome of each job dropped. When the owners cannot be read
// every job is dropped with that error (redelivered).
func (s *Scheduler) claimOwners(ctx context.Context, jobs []*job, at []int, errs []error) ([]*job, []int) {
	if s.owners == nil || len(jobs) == 0 {
		return jobs, at
	}
	rentals, tenants := make([]string, len(jobs)), make([]string, len(jobs))
	for i, j := range jobs {
		rentals[i], tenants[i] = j.Event.GetRentalId(), j.Event.GetTenantId()
	}
	owners, err := s.owners.ClaimOwners(ctx, rentals, tenants)
	if err != nil {
		for k := range jobs {
			errs[at[k]] = err
		}
		return nil, nil
	}
	keptJobs, keptAt := jobs[:0], at[:0]
	for k, j := range jobs {
		if owners[k] == tenants[k] {
			keptJobs, keptAt = append(keptJobs, j), append(keptAt, at[k])
			continue
		}
		s.d.Log.WarnContext(ctx, "request under another tenant's rental id rejected", "rental", rentals[k], "tenant", tenants[k])
		errs[at[k]] = s.refuseRequest(ctx, j.Event, notOwned(rentals[k]))
	}
	return keptJobs, keptAt
}

// refuseRequest publishes a rejection (REJECT_REASON_NOT_PERMITTED) of a
// request the scheduler will not decide on, without recording an outcome:
// the outcome records under its rental id are the owner's.
func (s *Scheduler) refuseRequest(ctx context.Context, ev *shizuv1.RentalRequested, msg string) error {
	return s.refuse(ctx, refusedID(ev.GetRentalId(), ev.GetTenantId(), ev.GetMeta().GetEventId()), ev.GetTenantId(), ev.GetRentalId(),
		ev.GetMeta().GetEventId(), shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED, msg)
}

// refusedID names the rejection of the event causation by tenant: stored
// once per refused event, and never the owner's own rejection's id.
func refusedID(rental, tenant, causation string) string {
	return shizuv1.Truncate(fmt.Sprintf("rental:%s:refused:%s:%s", rental, tenant, causation), shizuv1.MaxEventIDBytes)
}

// refuse publishes a RentalRejected (event id id) to tenant about rental,
// caused by the event causation ("" when unknown), recording no outcome.
func (s *Scheduler) refuse(ctx context.Context, id, tenant, rental, causation string, reason shizuv1.RejectReason, msg string) error {
	b := s.pub.NewBatch()
	err := s.publish(ctx, b, subject.RentalRejected, []string{tenant}, &shizuv1.RentalRejected{
		Meta:     shizuv1.NewMeta(id, s.source, causation, rental, s.d.Now()),
		RentalId: rental, TenantId: tenant, Reason: reason, Message: shizuv1.Truncate(msg, 1000),
	})
	if err != nil {
		return err
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	s.metrics.outcome(ctx, "refused")
	return nil
}

// owns reports whether tenant owns rental, claiming an id nobody owns yet
// (the tenant then owns it).
func (s *Scheduler) owns(ctx context.Context, rental, tenant string) (bool, error) {
	if s.owners == nil {
		return true, nil
	}
	owners, err := s.owners.ClaimOwners(ctx, []string{rental}, []string{tenant})
	if err != nil {
		return false, err
	}
	return owners[0] == tenant, nil
}

// ownsRequest is owns for a request the scheduler rejects before any
// round (its spec is invalid): a rejection records an outcome under the
// rental id, which must be the owner's. A request under another tenant's
// id is refused instead.
func (s *Scheduler) ownsRequest(ctx context.Context, ev *shizuv1.RentalRequested) (bool, error) {
	owned, err := s.owns(ctx, ev.GetRentalId(), ev.GetTenantId())
	if owned || err != nil {
		return owned, err
	}
	s.d.Log.WarnContext(ctx, "request under another tenant's rental id rejected", "rental", ev.GetRentalId(), "tenant", ev.GetTenantId())
	return false, s.refuseRequest(ctx, ev, notOwned(ev.GetRentalId()))
}

// ownsCancel is owns for a cancel: a cancel of another tenant's rental is
// answered with a rejection.
func (s *Scheduler) ownsCancel(ctx context.Context, ev *shizuv1.RentalCancelRequested) (bool, error) {
	owned, err := s.owns(ctx, ev.GetRentalId(), ev.GetTenantId())
	if owned || err != nil {
		return owned, err
	}
	s.d.Log.WarnContext(ctx, "cancel of another tenant's rental rejected", "rental", ev.GetRentalId(), "tenant", ev.GetTenantId())
	return false, s.refuse(ctx, refusedID(ev.GetRentalId(), ev.GetTenantId(), ev.GetMeta().GetEventId()), ev.GetTenantId(), ev.GetRentalId(),
		ev.GetMeta().GetEventId(), shizuv1.RejectReason_REJECT_REASON_NOT_PERMITTED,
		fmt.Sprintf("tenant %s has no rental %s to cancel", ev.GetTenantId(), ev.GetRentalId()))
}

// checkOwner refuses (dead-letters) an event about a rental that names
// another tenant than the rental's recorded owner: a stop or a move is a
// report about the owner's run, which nobody else may end or move.
func (s *Scheduler) checkOwner(ctx context.Context, what, rental, tenant string) error {
	if s.owners == nil {
		return nil
	}
	owner, err := s.owners.Owner(ctx, rental)
	if err != nil || owner == "" || owner == tenant {
		return err
	}
	return fault.Invalid("%s of rental %s names tenant %q, but the rental belongs to tenant %q", what, rental, tenant, owner)
}

// restoreOwners records again the owner of every rental of the stream.
func (s *Scheduler) restoreOwners(ctx context.Context, owners []history.Owner) error {
	if s.owners == nil {
		return nil
	}
	for start := 0; start < len(owners); start += claimChunk {
		chunk := owners[start:min(len(owners), start+claimChunk)]
		rentals, tenants := make([]string, len(chunk)), make([]string, len(chunk))
		for i, o := range chunk {
			rentals[i], tenants[i] = o.Rental, o.Tenant
		}
		if _, err := s.owners.ClaimOwners(ctx, rentals, tenants); err != nil {
			return err
		}
	}
	return nil
}

// ownersOf is the owners a scheduler on d keeps: d.Owners, else the
// records when they are ones (the Redis records are); nil (no ownership
// kept) only for test fakes that are neither.
func ownersOf(d Deps) ports.Owners {
	if d.Owners != nil {
		return d.Owners
	}
	o, _ := d.Records.(ports.Owners)
	return o
}
