package app_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/shared/testkit"
)

// requestedIs waits until the pool rentals requested so far are want.
func (e *env) requestedIs(t *testing.T, want ...string) {
	t.Helper()
	testkit.Eventually(t, 15*time.Second, func() error {
		if got := e.rentalEvents(t, "requested"); !slices.Equal(got, want) {
			return fmt.Errorf("requested %v, want %v", got, want)
		}
		return nil
	})
}

func TestAfterLosingRedisAPoolKeepsItsReplicasAndRequestsNoneAgain(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())
	e.requestedIs(t, "pool-web-1") // the floor
	e.sample(t, "web", 100)        // 100 per replica: two more
	e.requestedIs(t, "pool-web-1", "pool-web-2", "pool-web-3")

	e.redis.Restart(t) // comes back empty
	// Three replicas at 100 in all: two more, under new ids. Forgetting the
	// three would request the floor's pool-web-1 again, and reuse ids.
	e.sample(t, "web", 100)
	e.requestedIs(t, "pool-web-1", "pool-web-2", "pool-web-3", "pool-web-4", "pool-web-5")
	d := e.decisions(t, "web")
	if last := d[len(d)-1]; last.GetFromReplicas() != 3 || last.GetToReplicas() != 5 {
		t.Fatalf("the decision after the loss went from %d to %d replicas, want 3 to 5", last.GetFromReplicas(), last.GetToReplicas())
	}
	if got := e.rentalEvents(t, "cancel_requested"); len(got) != 0 {
		t.Fatalf("cancelled %v", got)
	}
}

func TestAPoolDeclaredThroughTheBusIsKnownAgainAfterLosingRedis(t *testing.T) {
	t.Parallel()
	e := start(t, testPolicy())
	e.declare(t, "api", "globex", apiPool())
	testkit.Eventually(t, 10*time.Second, func() error {
		if req, _ := e.poolRentals(t, "api"); len(req) != 2 {
			return fmt.Errorf("%d api rentals requested", len(req))
		}
		return nil
	})

	e.redis.Restart(t) // the declaration and the pool's record are gone with it
	// 50 in flight over the 2 replicas: 25 each, above 10: two more.
	e.sample(t, "api", 50)
	testkit.Eventually(t, 15*time.Second, func() error {
		if req, _ := e.poolRentals(t, "api"); !slices.Equal(req, []string{"pool-api-1", "pool-api-2", "pool-api-3", "pool-api-4"}) {
			return fmt.Errorf("api rentals requested %v", req)
		}
		return nil
	})
	if _, ok := e.storedPools(t)["api"]; !ok {
		t.Fatal("the declaration is not stored again")
	}
}
