package shizuv1

import (
	"strings"
	"testing"
)

func validPoolDeclared() *PoolDeclared {
	return &PoolDeclared{
		Meta: validMeta(), PoolId: "llama-70b", TenantId: "acme",
		PolicyJson: []byte(`{"id":"llama-70b","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":1,"max_replicas":4}`),
	}
}

func TestPoolDeclarationsAreValidated(t *testing.T) {
	withdrawal := validPoolDeclared()
	withdrawal.PolicyJson, withdrawal.Withdrawn = nil, true
	if err := withdrawal.Validate(); err != nil {
		t.Errorf("a withdrawal without a policy is refused: %v", err)
	}
	cases := []struct {
		name string
		mut  func(*PoolDeclared)
		want string
	}{
		{"a pool id with a dot is refused", func(m *PoolDeclared) { m.PoolId = "a.b" }, `pool_id: "a.b" contains "."`},
		{"a declaration without a tenant is refused", func(m *PoolDeclared) { m.TenantId = "" }, "tenant_id: missing"},
		{"a declaration without a policy is refused", func(m *PoolDeclared) { m.PolicyJson = nil }, "policy_json: missing"},
		{"a policy that is not JSON is refused", func(m *PoolDeclared) { m.PolicyJson = []byte("{min_replicas: 1") }, "policy_json: not valid JSON"},
		{"an oversized policy is refused", func(m *PoolDeclared) { m.PolicyJson = []byte(`"` + strings.Repeat("x", MaxPoolPolicyBytes) + `"`) }, "policy_json: 65538 bytes, the limit is 65536"},
		{"a withdrawal that carries a policy is refused", func(m *PoolDeclared) { m.Withdrawn = true }, "policy_json: set on a withdrawal"},
		{"a declaration without its envelope is refused", func(m *PoolDeclared) { m.Meta = nil }, "meta: missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := validPoolDeclared()
			c.mut(m)
			err := m.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, c.want)
			}
		})
	}
}
