package identity_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/gateway/identity"
	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// directories opens n directories on one platform, each on its own
// connection as the gateway's NATS user (as n replicas would).
func directories(t *testing.T, n int) []*identity.Directory {
	t.Helper()
	d := testkit.Platform(t)
	var out []*identity.Directory
	for range n {
		conn := d.Connect(t, topology.Gateway)
		dir, err := identity.Open(t.Context(), conn.JetStream())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, dir)
	}
	return out
}

func TestTenantsAndKeysAreKeptAndOnlyTheHashIsStored(t *testing.T) {
	t.Parallel()
	dir := directories(t, 1)[0]
	ctx := t.Context()
	if _, err := dir.CreateTenant(ctx, "acme", "Acme Corp"); err != nil {
		t.Fatal(err)
	}
	if _, err := dir.CreateTenant(ctx, "acme", "again"); !fault.IsConflict(err) {
		t.Fatalf("second acme: %v, want a conflict", err)
	}
	for _, bad := range []string{"", "Acme", "a.b", "a*", "-x", "operator", strings.Repeat("a", 64)} {
		if _, err := dir.CreateTenant(ctx, bad, ""); !fault.IsInvalid(err) {
			t.Errorf("tenant id %q: %v, want invalid", bad, err)
		}
	}
	if _, err := dir.CreateTenant(ctx, "beta", ""); err != nil {
		t.Fatal(err)
	}
	ts, err := dir.ListTenants(ctx)
	if err != nil || len(ts) != 2 || ts[0].ID != "acme" || ts[0].Name != "Acme Corp" || ts[1].ID != "beta" {
		t.Fatalf("ListTenants = %+v, %v", ts, err)
	}
	if _, err := dir.GetTenant(ctx, "nobody"); !fault.IsNotFound(err) {
		t.Fatalf("GetTenant(nobody): %v", err)
	}

	k, secret, err := dir.CreateKey(ctx, "acme", identity.ReadWrite, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "shz_"+k.ID+"_") || strings.Contains(k.SHA256, secret) || k.SHA256 == "" {
		t.Fatalf("key %+v, secret %q", k, secret)
	}
	if _, _, err := dir.CreateKey(ctx, "nobody", identity.ReadOnly, ""); !fault.IsNotFound(err) {
		t.Fatalf("key for an unknown tenant: %v", err)
	}
	if _, _, err := dir.CreateKey(ctx, "acme", identity.Operator, ""); !fault.IsInvalid(err) {
		t.Fatalf("operator key of a tenant: %v", err)
	}
	if _, _, err := dir.CreateKey(ctx, "acme", identity.Scope("admin"), ""); !fault.IsInvalid(err) {
		t.Fatalf("scope admin: %v", err)
	}
	op, _, err := dir.CreateKey(ctx, "", identity.Operator, "ops")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := dir.ListKeys(ctx, "acme")
	if err != nil || len(keys) != 1 || keys[0].ID != k.ID {
		t.Fatalf("ListKeys(acme) = %+v, %v", keys, err)
	}
	if keys, _ := dir.ListKeys(ctx, identity.OperatorTenant); len(keys) != 1 || keys[0].ID != op.ID {
		t.Fatalf("ListKeys(operator) = %+v", keys)
	}
	for _, kk := range keys {
		if strings.Contains(kk.SHA256, "shz_") {
			t.Fatalf("a listed key carries its secret: %+v", kk)
		}
	}

	got, err := dir.Authenticate(ctx, secret)
	if err != nil || got.Tenant != "acme" || got.Scope != identity.ReadWrite {
		t.Fatalf("Authenticate = %+v, %v", got, err)
	}
	wrong := secret[:len(secret)-1] + map[bool]string{true: "0", false: "1"}[!strings.HasSuffix(secret, "0")]
	for _, bad := range []string{wrong, "", "shz_", "Bearer " + secret, strings.ToUpper(secret), secret + "0"} {
		if _, err := dir.Authenticate(ctx, bad); !errors.Is(err, identity.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want ErrUnauthenticated", bad, err)
		}
	}
	if _, err := dir.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if again, err := dir.RevokeKey(ctx, k.ID); err != nil || again.RevokedAt == nil {
		t.Fatalf("revoking twice: %+v, %v", again, err)
	}
	if _, err := dir.Authenticate(ctx, secret); !errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("a revoked key authenticated: %v", err)
	}
	if _, err := dir.RevokeKey(ctx, "000000000000"); !fault.IsNotFound(err) {
		t.Fatalf("revoke unknown: %v", err)
	}
}

func TestARevocationReachesAnotherReplicaWithinASecond(t *testing.T) {
	t.Parallel()
	dirs := directories(t, 2)
	one, two := dirs[0], dirs[1]
	ctx := t.Context()
	if _, err := one.CreateTenant(ctx, "acme", ""); err != nil {
		t.Fatal(err)
	}
	if err := two.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	k, secret, err := one.CreateKey(ctx, "acme", identity.ReadOnly, "")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Second, func() error {
		_, err := two.Authenticate(ctx, secret)
		return err
	})
	if _, err := one.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Second, func() error {
		if _, err := two.Authenticate(ctx, secret); err == nil {
			return errors.New("the second replica still accepts the revoked key")
		}
		return nil
	})
}
