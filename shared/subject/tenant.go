package subject

import "strings"

// Tenant subjects carry the tenant as their second token, always:
// rental.<tenant>.<event>, usage.<tenant>.<event>, invoice.<tenant>.<event>.
// Tenants' permissions and filters are written on that position
// (rental.<tenant>.>), so they stay valid when tokens are appended after
// the event (a node token, say). A consumer checks that an event's body
// names the tenant its subject does (shared/bus).
const (
	RentalOfTenant  = "rental.%s.>"
	UsageOfTenant   = "usage.%s.>"
	InvoiceOfTenant = "invoice.%s.>"
)

// tenantRoots are the first tokens of the tenant subjects.
var tenantRoots = [...]string{"rental", "usage", "invoice"}

// TenantOf returns the tenant a tenant subject names (its second token);
// false for a subject that is not a tenant subject.
func TenantOf(subj string) (string, bool) {
	root, rest, ok := strings.Cut(subj, ".")
	if !ok {
		return "", false
	}
	tenant, _, ok := strings.Cut(rest, ".")
	if !ok || tenant == "" {
		return "", false
	}
	for _, r := range tenantRoots {
		if root == r {
			return tenant, true
		}
	}
	return "", false
}
