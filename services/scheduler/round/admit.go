package round

import (
	"fmt"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Admit decides on a decoded request ev, r being its placement terms,
// before any round: a spec that fails validation is rejected at once
// (reject is the reason told to the tenant, REJECT_REASON_INVALID_SPEC),
// and so is a reserved request that does not allow only models the tenant
// holds a commitment for in cs when it was made (it would be billed at the
// list price), and so is one whose pending timeout is above cfg's maximum
// (MaxPendingTimeout); a request whose envelope or ids are unusable to answer it cannot even be
// rejected and is refused with an invalid error (dead-lettered); anything
// else goes to the next round (reject "" and no error).
func Admit(ev *shizuv1.RentalRequested, r *placement.Request, c placement.Catalogue, cfg Config) (reject string, err error) {
	if err := ev.Validate(); err != nil {
		if !headerValid(ev) {
			return "", fault.Invalid("RentalRequested: %w", err)
		}
		return err.Error(), nil
	}
	if err := r.Validate(c); err != nil {
		return err.Error(), nil
	}
	if d := ev.GetSpec().GetPendingTimeout(); d != nil && d.AsDuration() > cfg.maxPendingTimeout() {
		return fmt.Sprintf("pending timeout %s is longer than this scheduler allows (at most %s)",
			d.AsDuration(), cfg.maxPendingTimeout()), nil
	}
	if r.Class == rent.ClassReserved {
		return cfg.Commitments.missing(r, ev.GetMeta().GetOccurredAt().AsTime()), nil
	}
	return "", nil
}

// PendingTimeout is how long a request may wait for capacity: its spec's
// pending_timeout when set (Admit refused one above the maximum), else
// cfg.PendingTimeout.
func PendingTimeout(ev *shizuv1.RentalRequested, cfg Config) time.Duration {
	if d := ev.GetSpec().GetPendingTimeout(); d != nil && d.AsDuration() > 0 {
		return min(d.AsDuration(), cfg.maxPendingTimeout())
	}
	return cfg.PendingTimeout
}

func (cfg Config) maxPendingTimeout() time.Duration {
	return max(cfg.MaxPendingTimeout, cfg.PendingTimeout)
}

// missing says what a reserved request r made at t lacks to be billed at a
// commitment's rate ("" when nothing): it must allow only models the
// tenant holds a commitment for at t.
func (cs Commitments) missing(r *placement.Request, t time.Time) string {
	if len(r.Models) == 0 {
		return "plan reserved needs allowed_models naming the model of a commitment: a reserved rental is billed " +
			"against the tenant's commitment for the model it runs on, so it may not run on any model " +
			"(e.g. allowed_models [H100-SXM5-80GB])"
	}
	var none []string
	for _, m := range r.Models {
		if !cs.InForce(r.Tenant, m, t) {
			none = append(none, m)
		}
	}
	if len(none) == 0 {
		return ""
	}
	return fmt.Sprintf("plan reserved: tenant %s holds no reserved commitment in force at %s for %s; "+
		"rent on-demand, or have the commitment added to the accounts", r.Tenant, t.UTC().Format(time.RFC3339), strings.Join(none, ", "))
}

// headerValid reports whether a request's envelope and ids are usable to
// answer it (its spec aside).
func headerValid(ev *shizuv1.RentalRequested) bool {
	probe := &shizuv1.RentalRequested{Meta: ev.GetMeta(), RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(),
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}}
	return probe.Validate() == nil
}
