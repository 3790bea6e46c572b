package round

import (
	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Admit decides on a decoded request ev, r being its placement terms,
// before any round: a spec that fails validation is rejected at once
// (reject is the reason told to the tenant, REJECT_REASON_INVALID_SPEC); a
// request whose envelope or ids are unusable to answer it cannot even be
// rejected and is refused with an invalid error (dead-lettered); anything
// else goes to the next round (reject "" and no error).
func Admit(ev *shizuv1.RentalRequested, r *placement.Request, c placement.Catalogue) (reject string, err error) {
	if err := ev.Validate(); err != nil {
		if !headerValid(ev) {
			return "", fault.Invalid("RentalRequested: %w", err)
		}
		return err.Error(), nil
	}
	if err := r.Validate(c); err != nil {
		return err.Error(), nil
	}
	return "", nil
}

// headerValid reports whether a request's envelope and ids are usable to
// answer it (its spec aside).
func headerValid(ev *shizuv1.RentalRequested) bool {
	probe := &shizuv1.RentalRequested{Meta: ev.GetMeta(), RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(),
		Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 1000, Plan: shizuv1.Plan_PLAN_ON_DEMAND}}
	return probe.Validate() == nil
}
