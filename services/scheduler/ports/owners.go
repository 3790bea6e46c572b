package ports

import "context"

// Owners records which tenant owns each rental id. A rental id is chosen
// by its requester and shared by every tenant's events, so the first
// tenant to use one owns it: the scheduler refuses another tenant's
// request, cancel, stop or move under it. Records are kept as long as the
// scheduler's records (never dropped when the rental stops, so a stopped
// rental's id cannot be taken over) and rebuilt from the RENTALS stream.
type Owners interface {
	// ClaimOwners records tenants[i] as the owner of rentals[i] where
	// none is recorded, and returns each rental's owner after: tenants[i]
	// when the claim stood, another tenant when it was already owned.
	ClaimOwners(ctx context.Context, rentals, tenants []string) ([]string, error)
	// Owner is the recorded owner of a rental ("" when none is).
	Owner(ctx context.Context, rental string) (string, error)
}
