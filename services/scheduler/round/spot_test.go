package round_test

import (
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
)

// listPriced gives a node its agent's list price in USD.
func listPriced(n placement.Node, micros int64) placement.Node {
	n.PricePerGPUHourMicros, n.Currency = micros, "USD"
	return n
}

func cappedAt(micros int64) func(*round.Job) {
	return func(j *round.Job) {
		spot(j)
		j.Request.MaxSpotPrice = placement.Price{Micros: micros, Currency: "USD"}
	}
}

func TestASpotRequestWhoseMaxIsUnderEverySpotPriceWaitsForThePriceNotForCapacity(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	v := viewOf(listPriced(node("h100", 1), 2_490_000))
	plan := round.Plan(v, []*round.Job{job(t, "cheap", cappedAt(1_200_000))}, now, config(t), nil)
	if len(plan.Reserve) != 0 {
		t.Fatalf("reserved %+v on a node priced 2.49 for a max of 1.20", plan.Reserve[0].Placed)
	}
	if len(plan.Pending) != 1 || len(plan.Reject) != 0 {
		t.Fatalf("plan %+v, want one pending", plan)
	}
	p := plan.Pending[0]
	if p.Reason != shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX || p.Preempt != nil {
		t.Fatalf("pending %v, want waiting for the spot price", p.Reason)
	}
	if p.Shortage() {
		t.Fatal("reported as a capacity shortage: the autoscaler would add nodes the rental cannot afford either")
	}
	if msg := p.Message(); !strings.Contains(msg, "1.200000 USD") || !strings.Contains(msg, "spot price") {
		t.Fatalf("message %q, want it to name the max and the spot price", msg)
	}
}

func TestASpotRequestThatFitsNowhereAtAnyPriceStillWaitsForCapacity(t *testing.T) {
	t.Parallel()
	v := viewOf(listPriced(node("h100", 1), 1_000_000))
	big := job(t, "big", cappedAt(1_200_000), func(j *round.Job) { j.Request.GPUCount = 2 })
	plan := round.Plan(v, []*round.Job{big}, t0, config(t), nil)
	if len(plan.Pending) != 1 || plan.Pending[0].Reason != shizuv1.PendingReason_PENDING_REASON_NO_CAPACITY || !plan.Pending[0].Shortage() {
		t.Fatalf("plan %+v, want waiting for capacity", plan)
	}
}

func TestASpotRequestKeptOutByItsMaxPastItsDeadlineIsRejectedNamingThePrice(t *testing.T) {
	t.Parallel()
	v := viewOf(listPriced(node("h100", 1), 2_490_000))
	plan := round.Plan(v, []*round.Job{job(t, "cheap", cappedAt(1_200_000))}, t0.Add(time.Hour), config(t), nil)
	if len(plan.Reject) != 1 || plan.Reject[0].Reason != shizuv1.RejectReason_REJECT_REASON_PENDING_TIMEOUT {
		t.Fatalf("plan %+v, want rejected at its deadline", plan)
	}
	if msg := plan.Reject[0].Message; !strings.Contains(msg, "spot price") || !strings.Contains(msg, "1.200000 USD") {
		t.Fatalf("message %q, want it to say the spot price stayed above the max", msg)
	}
}
