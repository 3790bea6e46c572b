package quota

// Key and TenantOf expose the key escaping to the tests.
var (
	Key      = key
	TenantOf = tenantOf
)
