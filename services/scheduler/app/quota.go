package app

import (
	"context"
	"errors"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Quotas. Each reservation carries its tenant's quota (Deps.Quotas), and
// the store's reserve script refuses one that would take the tenant past
// it, atomically across replicas (shared/capacity, quota.go). A request
// refused so, or one that fits nowhere while its tenant's usage leaves no
// room for it, waits with PENDING_REASON_QUOTA (round.Job.OverQuota): no
// preemption, no capacity shortage. The pending set is retried when the
// store moves, so it is placed once the tenant's stops release GPUs.

// overQuota takes a quota refusal off j (its err) into j.OverQuota and
// reports whether it was one.
func overQuota(j *job) bool {
	var qe *capacity.QuotaError
	if !capacity.IsQuota(j.err) || !errors.As(j.err, &qe) {
		return false
	}
	j.OverQuota, j.err = qe.Reason(), nil
	return true
}

// usageReader is the store's read of a tenant's usage (*capacity.Store).
type usageReader interface {
	Usage(ctx context.Context, tenant string) (capacity.Usage, error)
}

// checkQuotas marks the undecided jobs that fit nowhere and whose tenant's
// usage leaves no room for them as over quota, so they wait for the
// tenant's own stops instead of asking for capacity or preempting (one
// usage read per tenant with a quota). A failed read leaves the jobs to
// the capacity decisions.
func (s *Scheduler) checkQuotas(ctx context.Context, jobs []*job) {
	store, ok := s.reserve.(usageReader)
	if s.d.Quotas == nil || !ok {
		return
	}
	usage := map[string]*capacity.Usage{}
	for _, j := range jobs {
		if j.Decided || j.OverQuota != "" {
			continue
		}
		q := s.d.Quotas.Quota(j.Request.Tenant)
		if q == nil {
			continue
		}
		u, seen := usage[j.Request.Tenant]
		if !seen {
			got, err := store.Usage(ctx, j.Request.Tenant)
			if err != nil {
				s.d.Log.WarnContext(ctx, "read tenant usage", "tenant", j.Request.Tenant, "err", err)
			} else {
				u = &got
			}
			usage[j.Request.Tenant] = u
		}
		if u != nil {
			j.OverQuota = quotaShort(&j.Request, q, *u)
		}
	}
}

// quotaShort says why usage u under quota q leaves no room for request r
// ("" when it does): the total, or every model r allows capped and full.
func quotaShort(r *placement.Request, q *capacity.Quota, u capacity.Usage) string {
	want := int64(r.GPUCount) * r.MilliPerGPU
	if u.MilliGPU+want > q.MaxGPUs*capacity.MilliPerGPU {
		return (&capacity.QuotaError{Tenant: r.Tenant, Limit: q.MaxGPUs, Used: u.MilliGPU, Want: want}).Reason()
	}
	if len(r.Models) == 0 {
		return ""
	}
	var why string
	for _, m := range r.Models {
		limit, capped := q.PerModel[m]
		if !capped || u.PerModel[m]+want <= limit*capacity.MilliPerGPU {
			return ""
		}
		if why == "" {
			why = (&capacity.QuotaError{Tenant: r.Tenant, Model: m, Limit: limit, Used: u.PerModel[m], Want: want}).Reason()
		}
	}
	return why
}
