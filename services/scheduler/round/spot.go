package round

import (
	"fmt"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
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
