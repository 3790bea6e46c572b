package queue_test

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/queue"
	"github.com/shizu-gpu/shizu/shared/rent"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ids(items []queue.Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestClassesGoReservedThenOnDemandThenSpot(t *testing.T) {
	t.Parallel()
	var q []queue.Item
	opts := queue.Options{}
	q = append(q, queue.Item{ID: "spot", Tenant: "a", Class: rent.ClassSpot, Priority: 1000, Enqueued: t0})
	q = append(q, queue.Item{ID: "od", Tenant: "b", Class: rent.ClassOnDemand, Enqueued: t0})
	q = append(q, queue.Item{ID: "res", Tenant: "c", Class: rent.ClassReserved, Enqueued: t0})
	if got := ids(queue.Order(q, t0, opts)); !equal(got, []string{"res", "od", "spot"}) {
		t.Fatalf("order %v", got)
	}
}

func TestHigherPriorityGoesFirstWithinAClass(t *testing.T) {
	t.Parallel()
	var q []queue.Item
	opts := queue.Options{}
	q = append(q, queue.Item{ID: "low", Tenant: "a", Class: rent.ClassOnDemand, Priority: 1, Enqueued: t0})
	q = append(q, queue.Item{ID: "high", Tenant: "b", Class: rent.ClassOnDemand, Priority: 9, Enqueued: t0.Add(time.Second)})
	if got := ids(queue.Order(q, t0.Add(time.Second), opts)); !equal(got, []string{"high", "low"}) {
		t.Fatalf("order %v", got)
	}
}

func TestAgingLetsAWaitingRequestOvertakeFresherHigherOnes(t *testing.T) {
	t.Parallel()
	opts := queue.Options{AgingStep: time.Second}
	var q []queue.Item
	q = append(q, queue.Item{ID: "old-spot", Tenant: "a", Class: rent.ClassSpot, Enqueued: t0})
	// Fresh on-demand requests keep arriving; the spot one has waited.
	now := t0.Add(500 * time.Second)
	q = append(q, queue.Item{ID: "new-od", Tenant: "b", Class: rent.ClassOnDemand, Enqueued: now})
	if got := ids(queue.Order(q, now, opts)); got[0] != "new-od" {
		t.Fatalf("after 500 s on-demand still goes first: %v", got)
	}
	// After a class span of waiting (1001 s) the spot request goes first.
	later := t0.Add(1002 * time.Second)
	q = append(q, queue.Item{ID: "newer-od", Tenant: "c", Class: rent.ClassOnDemand, Enqueued: later})
	if got := ids(queue.Order(q, later, opts)); !equal(got, []string{"new-od", "old-spot", "newer-od"}) {
		t.Fatalf("a spot request waiting 1002 s must not starve: %v", got)
	}
}

func TestOneTenantsBurstInterleavesWithOtherTenants(t *testing.T) {
	t.Parallel()
	var q []queue.Item
	opts := queue.Options{}
	for i := range 100 {
		q = append(q, queue.Item{ID: string(rune('A'+i/26)) + string(rune('a'+i%26)), Tenant: "bursty", Class: rent.ClassOnDemand, Enqueued: t0})
	}
	q = append(q, queue.Item{ID: "z-other", Tenant: "quiet", Class: rent.ClassOnDemand, Enqueued: t0.Add(time.Millisecond)})
	got := ids(queue.Order(q, t0.Add(time.Millisecond), opts))
	pos := -1
	for i, id := range got {
		if id == "z-other" {
			pos = i
		}
	}
	if pos > 1 {
		t.Fatalf("the quiet tenant's request waits behind %d of the burst", pos)
	}
}
