package placement_test

import (
	"errors"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// priced is a node whose agent registered a list price of micros USD per
// GPU-hour.
func priced(id string, micros int64) placement.Node {
	return with(node(id, 1), func(n *placement.Node) { n.PricePerGPUHourMicros, n.Currency = micros, "USD" })
}

// spotAt is a spot request capped at micros of currency per GPU-hour.
func spotAt(micros int64, currency string) func(*placement.Request) {
	return func(r *placement.Request) {
		r.Class, r.Market = rent.ClassSpot, rent.AnyMarket
		r.MaxSpotPrice = placement.Price{Micros: micros, Currency: currency}
	}
}

func TestACappedSpotRentalIsNeverPlacedWhereTheSpotPriceIsAboveItsMax(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		node placement.Node
		req  placement.Request
	}{
		{"a list price above the max turns the node away (the H100 at 2.49 for a max of 1.20)",
			priced("h100", 2_490_000), req("r", spotAt(1_200_000, "USD"))},
		{"a market spot price above the max turns the node away, whatever its list price",
			with(priced("n", 1_000_000), func(n *placement.Node) { n.SpotPrice = placement.Price{Micros: 1_300_000, Currency: "USD"} }),
			req("r", spotAt(1_200_000, "USD"))},
		{"a price in another currency than the max's cannot be compared: the node is turned away",
			with(priced("n", 1_000_000), func(n *placement.Node) { n.Currency = "EUR" }), req("r", spotAt(1_200_000, "USD"))},
		{"a node with no known price is turned away from a capped rental",
			node("n", 1), req("r", spotAt(1_200_000, "USD"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, pol := range placement.Policies {
				p, err := placer(t, pol).Place(&placement.Cluster{Nodes: []placement.Node{tc.node}}, &tc.req)
				var nf *placement.NoFitError
				if !errors.As(err, &nf) {
					t.Fatalf("%s: want no fit, got %+v, %v", pol, p, err)
				}
				if nf.Rejected[placement.ReasonSpotPrice] != 1 {
					t.Fatalf("%s: want the node turned away by %q, got %v", pol, placement.ReasonSpotPrice, nf.Rejected)
				}
			}
		})
	}
}

func TestACappedSpotRentalGoesWhereTheSpotPriceIsAtMostItsMax(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		nodes []placement.Node
		req   placement.Request
		want  string
	}{
		{"the node priced under the max takes it, not the one above",
			[]placement.Node{priced("h100", 2_490_000), priced("l40s", 990_000)}, req("r", spotAt(1_200_000, "USD")), "l40s"},
		{"a price equal to the max is not above it",
			[]placement.Node{priced("n", 1_200_000)}, req("r", spotAt(1_200_000, "USD")), "n"},
		{"a market spot price under the max takes it though the list price is above",
			[]placement.Node{with(priced("n", 2_490_000), func(n *placement.Node) { n.SpotPrice = placement.Price{Micros: 900_000, Currency: "USD"} })},
			req("r", spotAt(1_200_000, "USD")), "n"},
		{"a spot rental without a max pays the market price anywhere",
			[]placement.Node{priced("h100", 2_490_000)}, req("r", spotAt(0, "")), "h100"},
		{"an on-demand rental has no spot max",
			[]placement.Node{priced("h100", 2_490_000)}, req("r"), "h100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, pol := range placement.Policies {
				p, err := placer(t, pol).Place(&placement.Cluster{Nodes: tc.nodes}, &tc.req)
				if err != nil || p.NodeID != tc.want {
					t.Fatalf("%s: placed on %q (%v), want %s", pol, p.NodeID, err, tc.want)
				}
			}
		})
	}
}
