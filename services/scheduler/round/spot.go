package round

import (
	"fmt"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// PriceOnly reports whether a spot request with a maximum price fits
// nowhere only because of it: placed without the cap it would fit. It then
// waits for the price (PENDING_REASON_SPOT_PRICE_ABOVE_MAX), which is no
// capacity shortage: a new node would price above the cap as well.
func PriceOnly(v *view.View, r *placement.Request, cfg Config) bool {
	if !r.MaxSpotPrice.Known() {
		return false
	}
	uncapped := *r
	uncapped.MaxSpotPrice = placement.Price{}
	_, err := cfg.Placer.Place(v.Cluster(), &uncapped)
	return err == nil
}

// formatPrice writes a price as a decimal amount and its currency
// ("1.200000 USD").
func formatPrice(p placement.Price) string {
	return fmt.Sprintf("%d.%06d %s", p.Micros/1_000_000, p.Micros%1_000_000, p.Currency)
}

// SpotPriceChange is a new spot price of a GPU model in a zone, in force
// from At (SpotPriceChanged).
type SpotPriceChange struct {
	Zone, Model string
	Price       placement.Price
	At          time.Time
}

// Interruptions are the preemptions a spot price change calls for: on
// every node of the change's zone whose GPUs are of its model, the spot
// rentals whose maximum the new price exceeds (or whose maximum is in
// another currency: metering bills none of their seconds), each given the
// preemption notice from the instant the price applies. Uncapped spot
// rentals pay the market price and stay; other classes have no maximum.
func Interruptions(v *view.View, ch SpotPriceChange, cfg Config) []Preempt {
	var out []Preempt
	c := v.Cluster()
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if n.Zone != ch.Zone || len(n.GPUs) == 0 || n.GPUs[0].Model != ch.Model {
			continue
		}
		var victims []placement.Allocation
		for _, a := range n.Allocations {
			mx := a.MaxSpotPrice
			if a.Class == rent.ClassSpot && mx.Known() && (mx.Currency != ch.Price.Currency || ch.Price.Micros > mx.Micros) {
				victims = append(victims, a)
			}
		}
		if len(victims) > 0 {
			out = append(out, Preempt{NodeID: n.ID, NodeEpoch: n.Epoch, Victims: victims, NoticeDeadline: ch.At.Add(cfg.PreemptionNotice)})
		}
	}
	return out
}
