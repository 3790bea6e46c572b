package app

import (
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
)

func TestAStoredPoolThatNoLongerReadsDoesNotHideTheOthers(t *testing.T) {
	t.Parallel()
	e := newReplicaEnv(t, fleetPolicy(1))
	s := e.replica(provider.NewMemory())
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
