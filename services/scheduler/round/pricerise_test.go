package round_test

import (
	"slices"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/round"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func usd(micros int64) placement.Price { return placement.Price{Micros: micros, Currency: "USD"} }

// priced is node with a list price of 2.00 USD and the given allocations.
func priced(id string, allocs ...placement.Allocation) placement.Node {
	n := node(id, 4)
	n.PricePerGPUHourMicros, n.Currency = 2_000_000, "USD"
	n.Allocations = allocs
	return n
}

func spotAt(id string, maxPrice placement.Price) placement.Allocation {
	return placement.Allocation{RentalID: id, Tenant: "t", Class: rent.ClassSpot, GPUs: []placement.Share{{Index: 0, Milli: 1000}},
		MaxSpotPrice: maxPrice}
}

func pricedOutIDs(nodes []placement.Node) []string {
	var ids []string
	for _, p := range round.PricesOut(nodes) {
		ids = append(ids, p.Rental.RentalID)
	}
	slices.Sort(ids)
	return ids
}

func TestASpotPriceAboveARunningRentalsMaxPricesItOut(t *testing.T) {
	h100 := round.SpotKey{Zone: "zone-a", Model: "H100-SXM5-80GB"}
	onDemand := spotAt("od", usd(1))
	onDemand.Class = rent.ClassOnDemand
	for _, tc := range []struct {
		name   string
		prices map[round.SpotKey]placement.Price
		allocs []placement.Allocation
		want   []string
	}{
		{"a rise above the max interrupts the rental", map[round.SpotKey]placement.Price{h100: usd(2_500_000)},
			[]placement.Allocation{spotAt("capped", usd(2_400_000))}, []string{"capped"}},
		{"a rise to exactly the max leaves it", map[round.SpotKey]placement.Price{h100: usd(2_400_000)},
			[]placement.Allocation{spotAt("capped", usd(2_400_000))}, nil},
		{"a fall below the list price leaves it", map[round.SpotKey]placement.Price{h100: usd(1_000_000)},
			[]placement.Allocation{spotAt("capped", usd(1_500_000))}, nil},
		{"no market price: the list price it was placed under stays and leaves it", nil,
			[]placement.Allocation{spotAt("capped", usd(2_000_000))}, nil},
		{"a price of another model leaves it", map[round.SpotKey]placement.Price{{Zone: "zone-a", Model: "A100-PCIE-40GB"}: usd(9_000_000)},
			[]placement.Allocation{spotAt("capped", usd(2_000_000))}, nil},
		{"a price of another zone leaves it", map[round.SpotKey]placement.Price{{Zone: "zone-b", Model: h100.Model}: usd(9_000_000)},
			[]placement.Allocation{spotAt("capped", usd(2_000_000))}, nil},
		{"a spot rental without a max is never priced out", map[round.SpotKey]placement.Price{h100: usd(9_000_000)},
			[]placement.Allocation{spotAt("uncapped", placement.Price{})}, nil},
		{"an on-demand rental (or a victim already preempted) is not priced out", map[round.SpotKey]placement.Price{h100: usd(9_000_000)},
			[]placement.Allocation{onDemand}, nil},
		{"a max in another currency is left alone", map[round.SpotKey]placement.Price{h100: usd(9_000_000)},
			[]placement.Allocation{spotAt("euro", placement.Price{Micros: 1, Currency: "EUR"})}, nil},
		{"only the rentals whose max is under the price", map[round.SpotKey]placement.Price{h100: usd(3_000_000)},
			[]placement.Allocation{spotAt("low", usd(2_999_999)), spotAt("high", usd(3_000_000)), spotAt("lower", usd(100))},
			[]string{"low", "lower"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []placement.Node{priced("n1", tc.allocs...)}
			round.SetSpotPrices(nodes, tc.prices)
			if got := pricedOutIDs(nodes); !slices.Equal(got, tc.want) {
				t.Fatalf("priced out %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAPricedOutRentalNamesItsNodeAndThePrice(t *testing.T) {
	nodes := []placement.Node{priced("n1", spotAt("capped", usd(1_200_000)))}
	round.SetSpotPrices(nodes, map[round.SpotKey]placement.Price{{Zone: "zone-a", Model: "H100-SXM5-80GB"}: usd(2_500_000)})
	got := round.PricesOut(nodes)
	if len(got) != 1 || got[0].NodeID != "n1" || got[0].NodeEpoch != 3 || got[0].Price != usd(2_500_000) {
		t.Fatalf("priced out %+v", got)
	}
	if m := got[0].Message(); m != "spot price 2.500000 USD per GPU-hour is above the rental's maximum 1.200000 USD" {
		t.Fatalf("message %q", m)
	}
}
