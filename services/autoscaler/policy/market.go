package policy

import (
	"time"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// Market is where a replica (or node) is bought: Shizu's one market
// vocabulary, shared/rent (Market.Plan is a replica's rental plan).
type Market = rent.Market

// Markets.
const (
	OnDemand = rent.OnDemand
	Spot     = rent.Spot
)

// Market rule names.
const (
	RuleMarketDefault  = "market:on-demand-default"
	RuleMarketSpotTime = "market:spot-window"
	RuleMarketDayTime  = "market:on-demand-window"
	RuleSpotFallback   = "market:spot-short-fallback"
)

// ChooseMarket picks the market of new replicas at now: on-demand without a
// mix; spot inside the mix's local spot window unless spot was reported
// short (until spotShortUntil), in which case on-demand.
func ChooseMarket(mix *MarketMix, now time.Time, spotShortUntil time.Time) (Market, string) {
	if mix == nil {
		return OnDemand, RuleMarketDefault
	}
	loc, err := time.LoadLocation(mix.Timezone)
	if err != nil {
		loc = time.UTC // Validate refuses such a mix; stay safe anyway.
	}
	from, _ := parseClock(mix.SpotFrom)
	to, _ := parseClock(mix.SpotTo)
	local := now.In(loc)
	m := local.Hour()*60 + local.Minute()
	inSpot := from < to && m >= from && m < to || from > to && (m >= from || m < to)
	if !inSpot {
		return OnDemand, RuleMarketDayTime
	}
	if now.Before(spotShortUntil) {
		return OnDemand, RuleSpotFallback
	}
	return Spot, RuleMarketSpotTime
}

// MarkSpotShort records that spot capacity was short at now: new replicas
// go on-demand for the mix's fallback hold.
func MarkSpotShort(p Pool, st State, now time.Time) State {
	hold := 10 * time.Minute
	if p.MarketMix != nil {
		hold = p.MarketMix.FallbackHold.D()
	}
	if until := now.Add(hold); until.After(st.SpotShortUntil) {
		st.SpotShortUntil = until
	}
	return st
}
