// Package queue is level one of Shizu's two-level scheduling: the order in
// which waiting rental requests are tried. It is pure (no I/O); the time is
// passed in.
//
// Order: class first (reserved > on-demand > spot), then priority, then
// age. Aging adds one priority point per Options.AgingStep waited, across
// classes too (a class is worth ClassSpan points), so a request that waits
// long enough overtakes anything fresher and nothing starves. Fairness: a
// tenant's n-th request in the queue loses n·Options.TenantPenalty points,
// so one tenant's burst interleaves with other tenants' requests instead of
// going first as a block.
package queue

import (
	"cmp"
	"slices"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// ClassSpan is the number of priority points one class is worth: above
// the highest priority (1000).
const ClassSpan = 1001

// Options tune the order.
type Options struct {
	// AgingStep is the wait that is worth one priority point (default 1 s).
	AgingStep time.Duration
	// TenantPenalty is the points a tenant's request loses for each earlier
	// request of the same tenant in the queue (default 1).
	TenantPenalty int64
}

func (o Options) withDefaults() Options {
	if o.AgingStep <= 0 {
		o.AgingStep = time.Second
	}
	if o.TenantPenalty < 0 {
		o.TenantPenalty = 0
	} else if o.TenantPenalty == 0 {
		o.TenantPenalty = 1
	}
	return o
}

// Item is one waiting request.
type Item struct {
	ID       string
	Tenant   string
	Class    placement.Class
	Priority int
	Enqueued time.Time
	// Value is the caller's payload.
	Value any
}

// Effective is an item's ordering value at now, before the tenant
// penalty: class·ClassSpan + priority + waited/AgingStep.
func Effective(it Item, now time.Time, o Options) int64 {
	o = o.withDefaults()
	age := max(0, now.Sub(it.Enqueued)) / o.AgingStep
	return int64(it.Class)*ClassSpan + int64(it.Priority) + int64(age)
}

// Order sorts items (in place, and returns them) in the order to try them:
// highest effective value first, after the per-tenant penalty; ties by
// enqueue time, then id.
func Order(items []Item, now time.Time, o Options) []Item {
	o = o.withDefaults()
	type keyed struct {
		it  Item
		eff int64
	}
	ks := make([]keyed, len(items))
	for i, it := range items {
		ks[i] = keyed{it, Effective(it, now, o)}
	}
	byValue := func(a, b keyed) int {
		return cmp.Or(-cmp.Compare(a.eff, b.eff), a.it.Enqueued.Compare(b.it.Enqueued), cmp.Compare(a.it.ID, b.it.ID))
	}
	// The tenant's n-th request (in plain order) loses n·penalty.
	slices.SortFunc(ks, byValue)
	seen := map[string]int64{}
	for i := range ks {
		t := ks[i].it.Tenant
		ks[i].eff -= seen[t] * o.TenantPenalty
		seen[t]++
	}
	slices.SortStableFunc(ks, byValue)
	for i := range ks {
		items[i] = ks[i].it
	}
	return items
}
