package round

import (
	"fmt"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// SpotKey names one spot market: a GPU model in a zone (SpotPriceChanged
// is per model and zone, and metering bills a spot second at the price of
// the rental's zone and model).
type SpotKey struct{ Zone, Model string }

// SpotKeyOf is the market of a node: its zone and the model of its GPUs
// (a node's GPUs are of one model); false for a node without GPUs.
func SpotKeyOf(n *placement.Node) (SpotKey, bool) {
	if len(n.GPUs) == 0 {
		return SpotKey{}, false
	}
	return SpotKey{Zone: n.Zone, Model: n.GPUs[0].Model}, true
}

// SetSpotPrices gives each node of a known market its market's price as
// SpotPrice; the other nodes keep theirs (none: the list price applies).
func SetSpotPrices(nodes []placement.Node, prices map[SpotKey]placement.Price) {
	for i := range nodes {
		if k, ok := SpotKeyOf(&nodes[i]); ok {
			if p, ok := prices[k]; ok {
				nodes[i].SpotPrice = p
			}
		}
	}
}

// PricedOut is a running spot rental whose node's spot price rose above
// its maximum: it is interrupted (RentalPreempted with
// PREEMPT_REASON_SPOT_PRICE_ABOVE_MAX, then stopped).
type PricedOut struct {
	NodeID    string
	NodeEpoch uint64
	Rental    placement.Allocation
	// Price is the node's spot price in force, above Rental.MaxSpotPrice.
	Price placement.Price
}

// Message is the notice's detail for the tenant.
func (p PricedOut) Message() string {
	return fmt.Sprintf("spot price %s per GPU-hour is above the rental's maximum %s", formatPrice(p.Price), formatPrice(p.Rental.MaxSpotPrice))
}

// PricesOut returns the spot rentals on nodes priced above their maximum:
// a rental of class spot with a cap, on a node whose current spot price
// (CurrentSpotPrice: the market price, else the list price) is in the
// cap's currency and above it. A rental without a cap, of another class,
// or already preempted (hidden as on-demand by the view) is left alone,
// and so is one whose cap is in another currency: no price is known to
// compare (placement never puts one there).
func PricesOut(nodes []placement.Node) []PricedOut {
	var out []PricedOut
	for i := range nodes {
		n := &nodes[i]
		price := n.CurrentSpotPrice()
		if !price.Known() {
			continue
		}
		for _, a := range n.Allocations {
			if a.Class != rent.ClassSpot || !a.MaxSpotPrice.Known() {
				continue
			}
			if a.MaxSpotPrice.Currency == price.Currency && price.Micros > a.MaxSpotPrice.Micros {
				out = append(out, PricedOut{NodeID: n.ID, NodeEpoch: n.Epoch, Rental: a, Price: price})
			}
		}
	}
	return out
}
