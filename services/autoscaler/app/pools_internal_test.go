package app

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestAStoredPoolThatNoLongerReadsDoesNotHideTheOthers(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, fleetPolicy(1))
	s := e.replica(providertest.NewMemory())
	rdb := e.redis.Client(t)
	good := `{"seq":1,"tenant":"acme","policy":{"id":"good","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":1,"max_replicas":2,"max_step_out":1,"max_step_in":1,"target_tracking":{"metric":"requests_per_second_per_replica","value":10}}}`
	// As if the rules had tightened since it was stored: max below min.
	stale := `{"seq":2,"tenant":"acme","policy":{"id":"stale","tenant":"acme","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":3,"max_replicas":2,"max_step_out":1,"max_step_in":1,"target_tracking":{"metric":"requests_per_second_per_replica","value":10}}}`
	if err := rdb.HSet(t.Context(), "shizu:autoscaler:pools", "good", good, "stale", stale).Err(); err != nil {
		t.Fatal(err)
	}
	pools, err := s.allPools(t.Context())
	if err == nil || !strings.Contains(err.Error(), "declared pool stale no longer validates") {
		t.Errorf("allPools error = %v; want it to name the stale pool", err)
	}
	if len(pools) != 1 || pools[0].ID != "good" {
		t.Fatalf("allPools = %v; want the good pool", pools)
	}
}

// requestedRentals lists the rental ids requested for tenant on the
// RENTALS stream so far.
func (e *replicaEnv) requestedRentals(tenant string) []string {
	e.t.Helper()
	st, err := e.pub.JetStream().Stream(e.t.Context(), topology.StreamRentals)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := st.GetMsg(e.t.Context(), seq)
		if err != nil || m.Subject != "rental."+tenant+".requested" {
			continue
		}
		var ev shizuv1.RentalRequested
		if err := proto.Unmarshal(m.Data, &ev); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, ev.GetRentalId())
	}
	return out
}

func TestASampleOrTickThatReadThePolicyBeforeAWithdrawalRequestsNoReplica(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, policy.File{})
	s := e.replica(nil)
	ctx := t.Context()
	const pol = `{"id":"api","tenant":"globex","rental":{"gpu_count":1,"milli_gpu":1000},"min_replicas":2,"max_replicas":6,"max_step_out":2,"max_step_in":2,"thresholds":[{"name":"busy","metric":"concurrent_requests_per_replica","scale_out_above":10,"scale_in_below":3,"step":2}]}`
	declare := func(seq uint64, withdrawn bool) {
		t.Helper()
		ev := &shizuv1.PoolDeclared{Meta: &shizuv1.EventMeta{EventId: fmt.Sprintf("declare-%d", seq), OccurredAt: timestamppb.Now(), Source: "cli"},
			PoolId: "api", TenantId: "globex", Withdrawn: withdrawn}
		if !withdrawn {
			ev.PolicyJson = []byte(pol)
		}
		if err := s.onPoolDeclared(ctx, ev, bus.Delivery{StreamSeq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	declare(1, false)
	stale, ok, err := s.pool(ctx, "api")
	if err != nil || !ok {
		t.Fatalf("pool(api) = %v, %v; want the declared pool", ok, err)
	}
	s.tickPool(ctx, stale, time.Now())
	if got := e.requestedRentals("globex"); len(got) != 2 {
		t.Fatalf("requested %v after the first tick; want the 2 replicas of the floor", got)
	}

	// The withdrawal lands after the sample and the tick read the policy.
	declare(2, true)
	sample := &shizuv1.TrafficSampled{Meta: &shizuv1.EventMeta{EventId: "sample-1", OccurredAt: timestamppb.Now(), Source: "gateway"},
		PoolId: "api", ConcurrentRequests: 100, RequestsPerSecond: 1000}
	if err := s.scaleOnSample(ctx, stale, sample); err != nil {
		t.Fatal(err)
	}
	s.tickPool(ctx, stale, time.Now())
	if got := e.requestedRentals("globex"); len(got) != 2 {
		t.Errorf("requested %v; a withdrawn pool got replicas back", got)
	}
	rec, err := s.states.read(ctx, s.states.rdb, s.states.key("api"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Rentals) != 0 || !rec.Withdrawn {
		t.Errorf("record after the withdrawal = %+v; want withdrawn without rentals", rec)
	}

	// Declared again, the pool scales, with rental ids never used before.
	declare(3, false)
	s.tickPool(ctx, stale, time.Now())
	got := e.requestedRentals("globex")
	want := []string{"pool-api-1", "pool-api-2", "pool-api-3", "pool-api-4"}
	if !slices.Equal(got, want) {
		t.Errorf("requested %v after declaring the pool again; want %v", got, want)
	}
}
