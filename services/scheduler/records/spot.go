package records

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
)

// The spot market is kept under one more key:
//
//	<prefix>:sched:spot  hash  "<zone>|<model>" -> price JSON
//
// MARKET is consumed by one durable that the replicas share, so each price
// change reaches one replica; the hash is how the others learn it.

var _ ports.SpotMarket = (*Redis)(nil)

// spotJSON is a spot price as stored. At is EffectiveAt in Unix
// microseconds (exact in a Lua number, so the script compares it).
type spotJSON struct {
	Micros   int64  `json:"micros"`
	Currency string `json:"currency"`
	At       int64  `json:"at"`
}

// setSpotPrice stores ARGV[1] (a price JSON) under KEYS[1] field ARGV[2]
// unless the stored one is in force from later; it returns the stored one.
var setSpotPrice = redis.NewScript(`
local held = redis.call('HGET', KEYS[1], ARGV[2])
if held and cjson.decode(held).at >= cjson.decode(ARGV[1]).at then return held end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[1])
return ARGV[1]
`)

func (r *Redis) spotKey() string { return r.prefix + ":sched:spot" }

// spotField is a price's field: zone and model are tokens, which hold no
// "|".
func spotField(zone, model string) string { return zone + "|" + model }

// SetSpotPrice implements ports.SpotMarket. Of two changes with the same
// EffectiveAt (one event, delivered twice) the first stays.
func (r *Redis) SetSpotPrice(ctx context.Context, p ports.SpotPrice) (ports.SpotPrice, error) {
	raw, err := json.Marshal(spotJSON{Micros: p.Price.Micros, Currency: p.Price.Currency, At: p.EffectiveAt.UnixMicro()})
	if err != nil {
		return ports.SpotPrice{}, fmt.Errorf("encode spot price: %w", err)
	}
	held, err := setSpotPrice.Run(ctx, r.rdb, []string{r.spotKey()}, raw, spotField(p.Zone, p.Model)).Text()
	if err != nil {
		return ports.SpotPrice{}, unavailable("set spot price", err)
	}
	out, ok := decodeSpot(spotField(p.Zone, p.Model), held)
	if !ok {
		return ports.SpotPrice{}, fmt.Errorf("scheduler records: spot price of %s in %s does not decode: %q", p.Model, p.Zone, held)
	}
	return out, nil
}

// SpotPrices implements ports.SpotMarket; a price that does not decode is
// left out.
func (r *Redis) SpotPrices(ctx context.Context) ([]ports.SpotPrice, error) {
	all, err := r.rdb.HGetAll(ctx, r.spotKey()).Result()
	if err != nil {
		return nil, unavailable("read spot prices", err)
	}
	out := make([]ports.SpotPrice, 0, len(all))
	for field, raw := range all {
		if p, ok := decodeSpot(field, raw); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

func decodeSpot(field, raw string) (ports.SpotPrice, bool) {
	zone, model, ok := strings.Cut(field, "|")
	var s spotJSON
	if !ok || json.Unmarshal([]byte(raw), &s) != nil || s.Currency == "" {
		return ports.SpotPrice{}, false
	}
	return ports.SpotPrice{Zone: zone, Model: model, Price: placement.Price{Micros: s.Micros, Currency: s.Currency},
		EffectiveAt: time.UnixMicro(s.At).UTC()}, true
}
