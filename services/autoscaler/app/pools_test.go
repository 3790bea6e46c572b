package app_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/app"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var declSeq atomic.Int64

// declare publishes a PoolDeclared for pool of tenant, as `shizu pools
// apply` does; policy nil withdraws the pool.
func (e *env) declare(t *testing.T, pool, tenant string, pol any) {
	t.Helper()
	ev := &shizuv1.PoolDeclared{
		Meta:   &shizuv1.EventMeta{EventId: fmt.Sprintf("declare-%s-%d", pool, declSeq.Add(1)), OccurredAt: timestamppb.Now(), Source: "cli"},
		PoolId: pool, TenantId: tenant, Withdrawn: pol == nil,
	}
	if pol != nil {
		data, err := json.Marshal(pol)
		if err != nil {
			t.Fatal(err)
		}
		ev.PolicyJson = data
	}
	if _, err := e.admin.Publish(t.Context(), "scale."+pool+".declared", ev); err != nil {
		t.Fatal(err)
	}
}

// deadLetters returns the reasons of the dead-lettered pool declarations
// so far, oldest first.
func (e *env) deadLetters(t *testing.T) []string {
	t.Helper()
	st, err := e.admin.JetStream().Stream(t.Context(), topology.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			continue
		}
		if m.Subject == "dlq.SCALING.autoscaler-pools" {
			out = append(out, m.Header.Get(bus.HeaderDLQReason))
		}
	}
	return out
}

func (e *env) storedPools(t *testing.T) map[string]string {
	t.Helper()
	m, err := e.redis.Client(t).HGetAll(t.Context(), "shizu:autoscaler:pools").Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// apiPool is a pool of tenant globex declared through the bus.
func apiPool() policy.Pool {
	return policy.Pool{
		ID: "api", Tenant: "globex",
		Rental:      policy.RentalShape{GPUCount: 1, MilliGPU: 500, VRAMMiB: 20480},
		MinReplicas: 2, MaxReplicas: 6, MaxStepOut: 2, MaxStepIn: 2,
		Thresholds: []policy.Threshold{{Name: "busy", Metric: policy.ConcurrentPerReplica, ScaleOutAbove: 10, ScaleInBelow: 3, Step: 2}},
	}
}

// poolRentals lists the rentals requested and cancelled for pool.
func (e *env) poolRentals(t *testing.T, pool string) (requested, cancelled []string) {
	for _, m := range e.seen.get("rental.>") {
		switch {
		case strings.HasSuffix(m.Subject, ".requested"):
			if ev := decode(t, m, &shizuv1.RentalRequested{}); ev.GetSpec().GetLabels()[app.PoolLabel] == pool {
				requested = append(requested, ev.GetRentalId())
			}
		case strings.HasSuffix(m.Subject, ".cancel_requested"):
			if ev := decode(t, m, &shizuv1.RentalCancelRequested{}); strings.HasPrefix(ev.GetRentalId(), "pool-"+pool+"-") {
				cancelled = append(cancelled, ev.GetRentalId())
			}
		}
	}
	return requested, cancelled
}

func TestAPoolDeclaredThroughTheBusScalesSurvivesARestartAndIsWithdrawn(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())

	// Declared: the floor of 2 replicas is requested for globex.
	e.declare(t, "api", "globex", apiPool())
	testkit.Eventually(t, 10*time.Second, func() error {
		if req, _ := e.poolRentals(t, "api"); len(req) != 2 {
			return fmt.Errorf("%d api rentals requested", len(req))
		}
		return nil
	})
	for _, m := range e.seen.get("rental.>") {
		if strings.HasPrefix(m.Subject, "rental.globex.") != strings.Contains(string(m.Data), "pool-api-") {
			t.Errorf("pool api's rental event on %s, not under its tenant globex", m.Subject)
		}
	}

	// A restart forgets nothing: the new process reads the pool from Redis
	// and scales it on traffic (50 in flight over 2 replicas: 25 each, above 10).
	e.stop()
	e.restart()
	e.sample(t, "api", 50)
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, d := range e.decisions(t, "api") {
			if d.GetFromReplicas() == 2 && d.GetToReplicas() == 4 && d.GetRule() == "threshold:busy" {
				return nil
			}
		}
		return fmt.Errorf("no scale-out of api after the restart: %v", e.decisions(t, "api"))
	})

	// Replaced: a new floor of 5 applies at once.
	bigger := apiPool()
	bigger.MinReplicas = 5
	e.declare(t, "api", "globex", bigger)
	testkit.Eventually(t, 10*time.Second, func() error {
		if req, _ := e.poolRentals(t, "api"); len(req) != 5 {
			return fmt.Errorf("%d api rentals requested; want 5 after the new floor", len(req))
		}
		return nil
	})

	// Withdrawn: every replica is cancelled, newest first, and the pool
	// decides nothing more.
	e.declare(t, "api", "globex", nil)
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, c := e.poolRentals(t, "api"); len(c) != 5 {
			return fmt.Errorf("%d api rentals cancelled", len(c))
		}
		return nil
	})
	_, cancelled := e.poolRentals(t, "api")
	if want := []string{"pool-api-5", "pool-api-4", "pool-api-3", "pool-api-2", "pool-api-1"}; !slices.Equal(cancelled, want) {
		t.Errorf("cancelled %v; want newest first %v", cancelled, want)
	}
	ds := e.decisions(t, "api")
	if last := ds[len(ds)-1]; last.GetToReplicas() != 0 || last.GetRule() != app.RuleWithdrawn {
		t.Errorf("last decision %v; want to 0 by %s", last, app.RuleWithdrawn)
	}
	e.sample(t, "api", 500)
	e.sample(t, "web", 500) // a sample that is handled after it
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, d := range e.decisions(t, "web") {
			if d.GetRule() == "threshold:busy" {
				return nil
			}
		}
		return fmt.Errorf("web's sample not handled yet")
	})
	if n := len(e.decisions(t, "api")); n != len(ds) {
		t.Errorf("a withdrawn pool still scales: %v", e.decisions(t, "api")[len(ds):])
	}
}

func TestBadPoolDeclarationsAreDeadLetteredAndChangeNothing(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())
	e.declare(t, "api", "globex", apiPool())
	testkit.Eventually(t, 10*time.Second, func() error {
		if len(e.storedPools(t)) != 1 {
			return fmt.Errorf("api not stored yet")
		}
		return nil
	})
	before := e.storedPools(t)

	invalid := apiPool()
	invalid.MaxReplicas, invalid.Thresholds[0].ScaleInBelow = 1, 20
	otherTenant := apiPool()
	otherTenant.Tenant = "initech"
	fileWeb := apiPool()
	fileWeb.ID, fileWeb.Tenant = "web", "acme"
	mismatched := apiPool()
	mismatched.ID = "api2"
	cases := []struct {
		pool, tenant string
		policy       any
		want         []string
	}{
		{"api", "globex", invalid, []string{"max_replicas: 1 is below min_replicas 2", "thresholds[0].scale_in_below: 20 must be in [0, scale_out_above 10)"}},
		{"api", "initech", otherTenant, []string{"pool api is globex's", "keeps the tenant"}},
		{"web", "acme", fileWeb, []string{"declared in the policy file, which wins"}},
		{"api", "globex", mismatched, []string{`id: "api2" differs from the declaration's pool_id "api"`}},
		{"api", "globex", map[string]any{"id": "api", "tenant": "globex", "replicas": 3}, []string{`unknown field "replicas"`}},
	}
	for _, c := range cases {
		e.declare(t, c.pool, c.tenant, c.policy)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if n := len(e.deadLetters(t)); n != len(cases) {
			return fmt.Errorf("%d of %d bad declarations dead-lettered", n, len(cases))
		}
		return nil
	})
	reasons := e.deadLetters(t)
	for i, c := range cases {
		for _, w := range c.want {
			if !strings.Contains(reasons[i], w) {
				t.Errorf("declaration %d dead-lettered with %q; want it to say %q", i, reasons[i], w)
			}
		}
	}
	if after := e.storedPools(t); !maps.Equal(before, after) {
		t.Errorf("bad declarations changed the stored pools:\nbefore %v\nafter  %v", before, after)
	}
}
