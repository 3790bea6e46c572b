package ledger

import (
	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// TariffOf is what seg is priced at: the catalogue's list price on demand;
// the rate of the tenant's commitment for the model in force at the
// segment's start when reserved (the list price without one); and for spot
// the market history spot of the segment's zone and model, with the
// catalogue's spot default before its first price. It is pure: the spot
// history is passed in (the store reads it up to the segment's end). What the catalogue cannot price is fault.Invalid.
func TariffOf(cat *pricing.Catalogue, accounts Accounts, seg Segment, spot []PricePoint) (Tariff, error) {
	list, err := cat.OnDemand(seg.Model)
	if err != nil {
		return Tariff{}, fault.Invalid("rental %s: %w", seg.RentalID, err)
	}
	t := Tariff{Base: list}
	switch seg.Plan {
	case shizuv1.Plan_PLAN_RESERVED:
		if c, ok := accounts.Commitment(seg.TenantID, seg.Model, seg.Start); ok {
			rate, err := c.Rate(cat)
			if err != nil {
				return Tariff{}, err
			}
			t.Base = rate
		}
	case shizuv1.Plan_PLAN_SPOT:
		if t.Base, err = cat.SpotDefault(seg.Model); err != nil {
			return Tariff{}, fault.Invalid("rental %s: %w", seg.RentalID, err)
		}
		t.Spot = spot
	}
	return t, nil
}

// NeedsSpotHistory says whether pricing seg takes its zone's spot history.
func NeedsSpotHistory(seg Segment) bool { return seg.Plan == shizuv1.Plan_PLAN_SPOT }
