package round_test

import (
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

// quotaCommit grants every reservation but those of the tenants named in
// over, which it refuses over quota (as the store does).
type quotaCommit struct {
	over    map[string]string // tenant -> reason
	pending []*round.Job
	settled int
}

func (c *quotaCommit) Reserve(j *round.Job) { c.pending = append(c.pending, j) }

func (c *quotaCommit) Settle() []*round.Job {
	var refused []*round.Job
	for _, j := range c.pending {
		if why, ok := c.over[j.Request.Tenant]; ok {
			j.OverQuota = why
			refused = append(refused, j)
		}
	}
	c.pending, c.settled = nil, c.settled+1
	return refused
}

func (c *quotaCommit) Refresh(bool) bool          { return false }
func (c *quotaCommit) Decided([]*round.Job) error { return nil }

// A request the store refuses over quota is not placed again: it waits
// with PENDING_REASON_QUOTA and the store's reason, starts no preemption
// and asks for no capacity; past its deadline it is rejected saying so.
func TestARequestRefusedOverQuotaWaitsForItsTenantsQuota(t *testing.T) {
	t.Parallel()
	v := viewOf(node("n1", 2))
	why := "tenant tenant-b holds 4 of the 4 GPUs its quota allows and asks for 1 more"
	c := &quotaCommit{over: map[string]string{"tenant-b": why}}
	plan := round.Plan(v, []*round.Job{job(t, "a"), job(t, "b")}, t0, config(t), c)
	if len(plan.Reserve) != 1 || plan.Reserve[0].Request.ID != "a" || len(plan.Refused) != 0 {
		t.Fatalf("reserve %d, refused %d; want a reserved and b not placed again", len(plan.Reserve), len(plan.Refused))
	}
	if c.settled != 1 {
		t.Fatalf("%d passes: a quota refusal must not be placed again", c.settled)
	}
	if len(plan.Pending) != 1 {
		t.Fatalf("pending %+v", plan.Pending)
	}
	p := plan.Pending[0]
	if p.Reason != shizuv1.PendingReason_PENDING_REASON_QUOTA || p.Shortage() || p.Preempt != nil || p.Missing.GPUCount != 0 {
		t.Fatalf("pending %v (shortage %v, preempt %v, missing %+v); want quota, no shortage, no preemption", p.Reason, p.Shortage(), p.Preempt, p.Missing)
	}
	if msg := p.Message(); msg != "waiting for room in the tenant's quota: "+why {
		t.Fatalf("message %q", msg)
	}
	if nodes := v.Cluster().Nodes; len(nodes[0].Allocations) != 1 {
		t.Fatalf("the view holds %d allocations; want only a's", len(nodes[0].Allocations))
	}

	// Still over quota past its deadline: rejected, naming the quota.
	late := job(t, "b", func(j *round.Job) { j.OverQuota = why })
	out := round.DecideNoFit(viewOf(node("n1", 2)), []*round.Job{late}, t0.Add(11*time.Minute), config(t))
	if len(out.Reject) != 1 || out.Reject[0].Reason != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT ||
		!strings.Contains(out.Reject[0].Message, "no room in the tenant's quota for 1 GPU(s) of 1000 milli within 10m0s: "+why) {
		t.Fatalf("rejects %+v", out.Reject)
	}
	// Waiting over quota already, with nothing new to say: left out.
	again := job(t, "b", func(j *round.Job) {
		j.OverQuota, j.FromPending, j.Reason = why, true, shizuv1.PendingReason_PENDING_REASON_QUOTA
	})
	if out := round.DecideNoFit(viewOf(node("n1", 2)), []*round.Job{again}, t0, config(t)); len(out.Pending) != 0 {
		t.Fatalf("a request still over quota said so again: %+v", out.Pending)
	}
}

// Requests that found no room only because the view still held bookings
// the store then refused over quota are placed again in the same round:
// another tenant's request is not left waiting for capacity that is free.
func TestRequestsCrowdedOutByRefusedBookingsArePlacedAgain(t *testing.T) {
	t.Parallel()
	v := viewOf(node("n1", 2))
	why := "tenant tenant-b holds 2 of the 2 GPUs its quota allows and asks for 1 more"
	c := &quotaCommit{over: map[string]string{"tenant-b": why}}
	ofB := func(j *round.Job) { j.Request.Tenant = "tenant-b" }
	jobs := []*round.Job{job(t, "b1", ofB), job(t, "b2", ofB), job(t, "b3", ofB), job(t, "a")}
	plan := round.Plan(v, jobs, t0, config(t), c)
	if len(plan.Reserve) != 1 || plan.Reserve[0].Request.ID != "a" {
		t.Fatalf("reserved %d; want a alone", len(plan.Reserve))
	}
	if len(plan.Pending) != 3 {
		t.Fatalf("%d pending; want b1..b3", len(plan.Pending))
	}
	for _, p := range plan.Pending {
		if p.Reason != shizuv1.PendingReason_PENDING_REASON_QUOTA || p.Shortage() {
			t.Fatalf("%s pending %v; want the quota, no shortage", p.Job.Request.ID, p.Reason)
		}
	}
}
