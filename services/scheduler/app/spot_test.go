package app_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// spotCapped is a spot spec for one whole GPU at most micros USD per
// GPU-hour.
func spotCapped(micros int64) *shizuv1.RentalSpec {
	sp := spec(1, 1000, 0, shizuv1.Plan_PLAN_SPOT)
	sp.MaxSpotPricePerGpuHour = &shizuv1.Money{Micros: micros, Currency: "USD"}
	return sp
}

func TestASpotRentalIsNeverScheduledOnANodePricedAboveItsMax(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h100 := gpuNode("h100", 2, capacity.MarketOnDemand)
	h100.PricePerGPUHourMicros = 2_490_000 // the H100's list price
	e.register(h100)
	e.replica(testConfig(), time.Now)
	e.publish(requested("cheap", "acme", spotCapped(1_200_000), time.Now()),
		requested("enough", "acme", spotCapped(2_490_000), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error {
		if len(o.scheduled["enough"]) != 1 {
			return fmt.Errorf("the spot rental whose max is the price: %d scheduled", len(o.scheduled["enough"]))
		}
		if len(o.pending["cheap"]) != 1 {
			return fmt.Errorf("the spot rental capped at 1.20: %d pending events", len(o.pending["cheap"]))
		}
		return nil
	})
	e.seen.mu.Lock()
	defer e.seen.mu.Unlock()
	if s := e.seen.scheduled["cheap"]; len(s) != 0 {
		t.Fatalf("the spot rental capped at 1.20 was scheduled on %s, priced 2.49", s[0].GetNodeId())
	}
	p := e.seen.pending["cheap"][0]
	if p.GetReason() != shizuv1.PendingReason_PENDING_REASON_SPOT_PRICE_ABOVE_MAX || !strings.Contains(p.GetMessage(), "1.200000 USD") {
		t.Fatalf("pending %v %q, want waiting for the spot price, naming the max", p.GetReason(), p.GetMessage())
	}
	if e.seen.shortages != 0 {
		t.Fatalf("%d capacity shortages: a rental waiting for the price asks for no node", e.seen.shortages)
	}
}
