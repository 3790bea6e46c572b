package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

// The operator verbs manage tenants and keys in the IDENTITY bucket over
// NATS as the admin: a key made by keys create works on the gateway until
// keys revoke.
func TestOperatorVerbsManageTenantsAndKeys(t *testing.T) {
	t.Setenv(envAPIURL, "")
	t.Setenv(envAPIKey, "")
	t.Setenv(envConfigDir, t.TempDir())
	s := startGatewayStack(t)
	if code, out, errOut := s.cli("tenants", "create", "acme", "-name", "Acme Corp"); code != 0 || !strings.Contains(out, "tenant acme (Acme Corp) created") {
		t.Fatalf("tenants create: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := s.cli("tenants", "create", "acme"); code != exitFail || !strings.Contains(errOut, "exists already") {
		t.Fatalf("tenants create twice: %d %s", code, errOut)
	}
	if code, _, errOut := s.cli("tenants", "create", "Not_A_Tenant"); code != exitUsage || !strings.Contains(errOut, "tenant id") {
		t.Fatalf("tenants create of a bad id: %d %s", code, errOut)
	}
	var ts []identity.Tenant
	s.json(&ts, "tenants", "ls")
	if len(ts) != 3 {
		t.Fatalf("tenants ls: %+v, want a, acme and b", ts)
	}
	var k createdKey
	s.json(&k, "keys", "create", "-tenant", "acme", "-read-only", "-name", "dash")
	if k.Scope != identity.ReadOnly || k.Tenant != "acme" || !strings.HasPrefix(k.Secret, "shz_"+k.ID+"_") {
		t.Fatalf("keys create: %+v", k)
	}
	if code, out, _ := s.cli("keys", "create", "-operator"); code != 0 || !strings.Contains(out, "shown only now") || !strings.Contains(out, "shz_") {
		t.Fatalf("keys create -operator: %d %s", code, out)
	}
	if code, _, errOut := s.cli("keys", "create", "-operator", "-tenant", "acme"); code != exitUsage {
		t.Fatalf("an operator key of a tenant: %d %s", code, errOut)
	}
	var shown struct {
		Keys []identity.Key `json:"keys"`
	}
	s.json(&shown, "tenants", "show", "acme")
	if len(shown.Keys) != 1 || shown.Keys[0].ID != k.ID || shown.Keys[0].SHA256 == "" {
		t.Fatalf("tenants show: %+v", shown)
	}
	if code, out, _ := s.cli("keys", "ls", "-tenant", "acme"); code != 0 || strings.Contains(out, k.Secret) || !strings.Contains(out, k.ID) {
		t.Fatalf("keys ls shows the secret or not the key: %s", out)
	}
	if code, _, errOut := s.cli("tenants", "show", "nobody"); code != exitNotFound {
		t.Fatalf("tenants show of an unknown tenant: %d %s", code, errOut)
	}

	t.Setenv(envAPIKey, k.Secret)
	testkit.Eventually(t, 5*time.Second, func() error { // the gateway's cache takes it within milliseconds
		if code, _, errOut := s.cli("ls"); code != 0 {
			return fmt.Errorf("ls with the new read-only key: %d %s", code, errOut)
		}
		return nil
	})
	if code, _, errOut := s.cli("rent"); code != exitDenied || !strings.Contains(errOut, "read-only") {
		t.Fatalf("rent with a read-only key: %d %s", code, errOut)
	}
	if code, out, errOut := s.cli("keys", "revoke", k.ID); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("keys revoke: %d %s %s", code, out, errOut)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if code, _, errOut := s.cli("ls"); code != exitDenied {
			return fmt.Errorf("ls with a revoked key: %d %s", code, errOut)
		}
		return nil
	})
}
