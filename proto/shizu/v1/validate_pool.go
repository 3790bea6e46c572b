package shizuv1

import "encoding/json"

// MaxPoolPolicyBytes bounds a pool's policy declared through the bus.
const MaxPoolPolicyBytes = 64 << 10

// Validate checks a pool declaration's envelope and ids, and that a
// declaration carries a JSON policy (at most MaxPoolPolicyBytes) and a
// withdrawal none. The policy's own rules are the autoscaler's (the policy
// file's), checked where it is applied.
func (m *PoolDeclared) Validate() error {
	if m == nil {
		return errMissing()
	}
	var p problems
	p.nest("meta", m.GetMeta().Validate())
	p.token("pool_id", m.GetPoolId())
	p.token("tenant_id", m.GetTenantId())
	policy := m.GetPolicyJson()
	switch {
	case m.GetWithdrawn() && len(policy) > 0:
		p.addf("policy_json", "set on a withdrawal; a withdrawn pool has no policy")
	case m.GetWithdrawn():
	case len(policy) == 0:
		p.addf("policy_json", "missing; a declaration carries the pool's policy (or set withdrawn)")
	case len(policy) > MaxPoolPolicyBytes:
		p.addf("policy_json", "%d bytes, the limit is %d", len(policy), MaxPoolPolicyBytes)
	case !json.Valid(policy):
		p.addf("policy_json", "not valid JSON")
	}
	return p.err()
}
