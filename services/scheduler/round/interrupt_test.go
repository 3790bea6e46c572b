package round_test

import (
	"slices"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// holding is node with one allocation per request, each on its own GPU.
func holding(n placement.Node, rs ...placement.Request) placement.Node {
	for i := range rs {
		n.Apply(&rs[i], placement.Placement{NodeID: n.ID, Epoch: n.Epoch, GPUs: []placement.Share{{Index: i, Milli: 1000, VRAMMiB: 80 * 1024}}}, t0)
	}
	return n
}

func spotRental(id string, capMicros int64, currency string) placement.Request {
	return placement.Request{ID: id, Tenant: "acme", Class: rent.ClassSpot, GPUCount: 1, MilliPerGPU: 1000,
		MaxSpotPrice: placement.Price{Micros: capMicros, Currency: currency}}
}

func TestASpotPriceRiseInterruptsTheRentalsWhoseMaxItExceedsAfterANotice(t *testing.T) {
	t.Parallel()
	cfg := config(t)
	onDemand := placement.Request{ID: "od", Tenant: "acme", Class: rent.ClassOnDemand, GPUCount: 1, MilliPerGPU: 1000}
	a := holding(node("a", 4), spotRental("capped-low", 1_200_000, "USD"), spotRental("capped-high", 3_000_000, "USD"),
		spotRental("uncapped", 0, ""), onDemand)
	b := holding(node("b", 2), spotRental("at-the-price", 2_000_000, "USD"), spotRental("other-currency", 5_000_000, "EUR"))
	elsewhere := node("c", 1)
	elsewhere.Zone = "zone-b"
	elsewhere = holding(elsewhere, spotRental("other-zone", 1_000_000, "USD"))
	v := viewOf(a, b, elsewhere)

	at := t0.Add(time.Hour)
	got := round.Interruptions(v, round.SpotPriceChange{Zone: "zone-a", Model: "H100-SXM5-80GB",
		Price: placement.Price{Micros: 2_000_000, Currency: "USD"}, At: at}, cfg)
	victims := map[string][]string{}
	for _, p := range got {
		if p.NodeEpoch != 3 || !p.NoticeDeadline.Equal(at.Add(cfg.PreemptionNotice)) {
			t.Fatalf("preemption %+v, want the node's epoch and the notice from the price's instant", p)
		}
		for _, vic := range p.Victims {
			victims[p.NodeID] = append(victims[p.NodeID], vic.RentalID)
		}
	}
	// The maximum at the price is not above it; a maximum in another
	// currency cannot be compared, and metering bills none of its seconds.
	want := map[string][]string{"a": {"capped-low"}, "b": {"other-currency"}}
	if len(victims) != len(want) || !slices.Equal(victims["a"], want["a"]) || !slices.Equal(victims["b"], want["b"]) {
		t.Fatalf("interrupted %v, want %v", victims, want)
	}
	if again := round.Interruptions(v, round.SpotPriceChange{Zone: "zone-a", Model: "A100-SXM4-80GB",
		Price: placement.Price{Micros: 9_000_000, Currency: "USD"}, At: at}, cfg); len(again) != 0 {
		t.Fatalf("a price of another model interrupted %+v", again)
	}
}

func TestAPlacedSpotRentalCarriesItsMaxIntoItsAllocation(t *testing.T) {
	t.Parallel()
	v := viewOf(listPriced(node("n1", 1), 1_000_000))
	plan := round.Plan(v, []*round.Job{job(t, "s", cappedAt(1_200_000))}, t0, config(t), nil)
	if len(plan.Reserve) != 1 {
		t.Fatalf("not placed: %+v", plan)
	}
	n, _ := v.Node("n1")
	if got := n.Allocations[0].MaxSpotPrice; got != (placement.Price{Micros: 1_200_000, Currency: "USD"}) {
		t.Fatalf("allocation max %+v", got)
	}
}
