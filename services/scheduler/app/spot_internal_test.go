package app

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func pricedOut(id string) round.PricedOut {
	return round.PricedOut{NodeID: "n1", NodeEpoch: 1, Price: placement.Price{Micros: 3_000_000, Currency: "USD"},
		Rental: placement.Allocation{RentalID: id, Tenant: "spotty", Class: rent.ClassSpot,
			MaxSpotPrice: placement.Price{Micros: 2_500_000, Currency: "USD"}}}
}

// Each rental priced out is claimed once, for the price: a new one is
// claimed and noticed; one already claimed for the price is noticed again
// with its recorded deadline (the same event: a notice lost after the
// claim is still given) until its stop is sent; one preempted for another
// rental, before the look or during it, is that preemption's.
func TestARentalPricedOutIsClaimedOnceAndNoticedWithItsRecordedDeadline(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := t.Context()
	earlier := roundNow.Add(-20 * time.Second)
	held := map[string]ports.Preemption{
		"again":    {Victim: "again", Tenant: "spotty", Preemptor: spotPricePreemptor, NodeID: "n1", NodeEpoch: 1, Notice: earlier},
		"other":    {Victim: "other", Tenant: "spotty", Preemptor: "od1", NodeID: "n1", NodeEpoch: 1, Notice: earlier},
		"stopping": {Victim: "stopping", Tenant: "spotty", Preemptor: spotPricePreemptor, NodeID: "n1", NodeEpoch: 1, StopSent: true},
	}
	// Preempted for od2 after the records were read.
	if _, err := r.rec.ClaimPreemption(ctx, []ports.Preemption{{Victim: "raced", Tenant: "spotty", Preemptor: "od2", NodeID: "n1"}}); err != nil {
		t.Fatal(err)
	}
	out := []round.PricedOut{pricedOut("new"), pricedOut("again"), pricedOut("other"), pricedOut("stopping"), pricedOut("raced")}
	n, err := r.s.interrupt(ctx, out, held, "spot:zone-a:H100-SXM5-80GB:2026-12-03T12:00:00Z")
	if err != nil || n != 1 {
		t.Fatalf("interrupted %d (%v), want one new", n, err)
	}
	notices := map[string]*shizuv1.RentalPreempted{}
	for _, p := range porttest.Events[*shizuv1.RentalPreempted](r.pub) {
		notices[p.GetRentalId()] = p
	}
	if len(notices) != 2 || notices["new"] == nil || notices["again"] == nil {
		t.Fatalf("noticed %v, want new and again", notices)
	}
	if got := notices["new"]; !got.GetNoticeDeadline().AsTime().Equal(roundNow.Add(r.s.cfg.PreemptionNotice)) ||
		got.GetReason() != shizuv1.PreemptReason_PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX || got.GetMeta().GetEventId() != "rental:new:preempted:spot-price:1" {
		t.Errorf("new: %v", got)
	}
	if got := notices["again"]; !got.GetNoticeDeadline().AsTime().Equal(earlier) {
		t.Errorf("again noticed until %v, recorded %v", got.GetNoticeDeadline().AsTime(), earlier)
	}
	ps, err := r.rec.Preemptions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Victim == "new" && p.Preemptor != spotPricePreemptor {
			t.Errorf("new claimed for %s", p.Preemptor)
		}
		if p.Victim == "raced" && p.Preemptor != "od2" {
			t.Errorf("raced taken from od2 by %s", p.Preemptor)
		}
	}
}
