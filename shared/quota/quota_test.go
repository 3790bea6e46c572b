package quota_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestLimitsValidateNamesWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		limits quota.Limits
		want   string // "" = valid
	}{
		{"a total alone is valid", quota.Limits{MaxGPUs: 8}, ""},
		{"a total with a model cap is valid", quota.Limits{MaxGPUs: 8, MaxGPUsPerModel: map[string]int64{gpumodel.H100SXM80: 2}}, ""},
		{"zero allows none and is valid", quota.Limits{MaxGPUs: 0}, ""},
		{"a negative total is refused", quota.Limits{MaxGPUs: -1}, "max_gpus: must be in 0.."},
		{"an unknown model is refused, naming the known ones", quota.Limits{MaxGPUs: 4, MaxGPUsPerModel: map[string]int64{"H100": 1}},
			`"H100" is not a GPU model Shizu knows (` + gpumodel.A1024 + ", "},
		{"a negative model cap is refused", quota.Limits{MaxGPUs: 4, MaxGPUsPerModel: map[string]int64{gpumodel.L424: -1}}, "L4-24GB: must be in 0.."},
		{"a model cap above the total is refused", quota.Limits{MaxGPUs: 4, MaxGPUsPerModel: map[string]int64{gpumodel.L424: 5}},
			"L4-24GB: 5 is more than max_gpus 4"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.limits.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if !fault.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v; want invalid, saying %q", err, c.want)
			}
		})
	}
}

func TestKeysAreOneToOneForAnyTenantToken(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, tenant := range []string{"acme", "ACME", "a-b_c", "a=b", "a=3Db", "ü", "a/b", "a:b", "a#b", "=41"} {
		k := quota.Key(tenant)
		if other, dup := seen[k]; dup {
			t.Fatalf("tenants %q and %q share key %q", other, tenant, k)
		}
		seen[k] = tenant
		if back, ok := quota.TenantOf(k); !ok || back != tenant {
			t.Fatalf("key %q of %q reads back as %q, %v", k, tenant, back, ok)
		}
		if strings.ContainsAny(k, ".*> ") {
			t.Fatalf("key %q of %q has a character a KV key may not", k, tenant)
		}
	}
	for _, bad := range []string{"a.b", "=4", "=41", "=zz", "a b"} {
		if tenant, ok := quota.TenantOf(bad); ok && quota.Key(tenant) != bad {
			t.Fatalf("key %q reads as %q, whose key is %q", bad, tenant, quota.Key(tenant))
		}
	}
}

// The operator (admin) writes quotas; the scheduler's own NATS user
// watches them and may not write them.
func TestQuotasAreWrittenByTheOperatorAndWatchedByTheScheduler(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t)
	ctx := t.Context()
	admin, err := quota.Open(ctx, d.Admin.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	odd := "team/x=1#"
	limits := quota.Limits{MaxGPUs: 4, MaxGPUsPerModel: map[string]int64{gpumodel.H100SXM80: 2}}
	if err := admin.Put(ctx, "acme", limits); err != nil {
		t.Fatal(err)
	}
	if err := admin.Put(ctx, odd, quota.Limits{MaxGPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Put(ctx, "acme", quota.Limits{MaxGPUs: -3}); !fault.IsInvalid(err) {
		t.Fatalf("Put of invalid limits = %v; want invalid", err)
	}
	if err := admin.Put(ctx, "a.b", limits); !fault.IsInvalid(err) {
		t.Fatalf("Put for a tenant that is no subject token = %v; want invalid", err)
	}
	if got, ok, err := admin.Get(ctx, "acme"); err != nil || !ok || got.String() != limits.String() {
		t.Fatalf("Get = %v, %v, %v; want %v (the invalid Put changed nothing)", got, ok, err, limits)
	}
	if _, ok, err := admin.Get(ctx, "globex"); err != nil || ok {
		t.Fatalf("Get of a tenant without a quota = %v, %v", ok, err)
	}

	sched := d.Connect(t, topology.Scheduler)
	store, err := quota.Open(ctx, sched.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	cache, err := store.Watch(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Stop)
	if got, ok := cache.Limits("acme"); !ok || got.String() != limits.String() {
		t.Fatalf("the cache starts with %v, %v; want %v", got, ok, limits)
	}
	if q := cache.Quota(odd); q == nil || q.MaxGPUs != 1 {
		t.Fatalf("quota of %q = %+v", odd, q)
	}
	if q := cache.Quota("globex"); q != nil {
		t.Fatalf("a tenant without a quota has %+v", q)
	}
	if err := admin.Put(ctx, "globex", quota.Limits{MaxGPUs: 2}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	// A value that does not decode (written around Put) leaves the tenant
	// without a quota.
	if _, err := d.Admin.JetStream().Publish(ctx, "$KV."+topology.QuotaBucket+"."+quota.Key(odd), []byte(`{"max_gpus":1,"max_gpu":2}`)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if q := cache.Quota("globex"); q == nil || q.MaxGPUs != 2 {
			return fmt.Errorf("globex's new quota not seen: %+v", q)
		}
		if _, ok := cache.Limits("acme"); ok {
			return errors.New("acme's deleted quota still cached")
		}
		if _, ok := cache.Limits(odd); ok {
			return errors.New("an undecodable quota is cached")
		}
		return nil
	})
	denied, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := store.Put(denied, "acme", quota.Limits{MaxGPUs: 100}); err == nil {
		t.Fatal("the scheduler's user wrote a quota")
	}
	if _, ok, err := admin.Get(ctx, "acme"); err != nil || ok {
		t.Fatalf("after the scheduler's refused write acme has a quota: %v, %v", ok, err)
	}
}
