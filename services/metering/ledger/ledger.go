// Package ledger turns a rental's run segments into usage records and
// usage records into invoices, cost reports and budget alerts. It is pure:
// no bus, no store, no clock; every function takes its inputs (and `until`,
// the instant up to which intervals may be closed) and returns values, so
// recomputing from the same inputs reproduces the bill to the micro-unit.
//
// Billing time. A run segment is one placement (attempt) of a rental on a
// node, from the node-agent's started_at to its stopped_at (or to the last
// heartbeat of a node that was lost, so a failover's dead interval is never
// billed). Second k of a segment is [start+k s, start+(k+1) s); the segment
// bills every second that starts before its end, which is per-second
// billing rounded up to the whole second. A second is priced at the price
// in force at its first instant.
//
// Records. Seconds are grouped into records at every interval boundary
// (multiples of Rules.Interval since the Unix epoch, UTC) and, for spot, at
// every price change. A record's id is "usage:<rental>:<record start as
// RFC 3339 with nanoseconds>", so every replica and every replay derives the
// same ids for the same usage.
//
// Minimum charge. An on-demand segment of a first placement (attempt 1)
// that the tenant's workload ended (completed, failed or cancelled) and that
// billed fewer seconds than Rules.MinimumCharge gets one more record, the
// top-up, covering [end, start+minimum) for the missing seconds. Segments
// the platform ended (preemption, migration, node failure) and later
// placements are not topped up.
//
// Spot. Each second is billed at the market price of the model and zone in
// force at its first instant; before the zone's first known market price,
// at Tariff.Base (metering passes the catalogue's spot default of the
// model, or its list price when the catalogue names none). Seconds priced
// above the tenant's maximum are not billed: the rental is being preempted.
package ledger

import (
	"errors"
	"fmt"
	"sort"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

// Rules are the billing rules of a deployment.
type Rules struct {
	// Interval is how often a running rental's usage is closed into a
	// record; whole seconds, 1 s .. 24 h (default 1 minute).
	Interval time.Duration
	// MinimumCharge is the least an on-demand rental is billed; whole
	// seconds, 0 .. 1 h (default 60 s).
	MinimumCharge time.Duration
}

// DefaultRules are the rules of the founding text.
func DefaultRules() Rules { return Rules{Interval: time.Minute, MinimumCharge: 60 * time.Second} }

// Validate reports every problem in r.
func (r Rules) Validate() error {
	var errs []error
	if r.Interval < time.Second || r.Interval > 24*time.Hour || r.Interval%time.Second != 0 {
		errs = append(errs, fmt.Errorf("interval: %s must be whole seconds in 1s..24h", r.Interval))
	}
	if r.MinimumCharge < 0 || r.MinimumCharge > time.Hour || r.MinimumCharge%time.Second != 0 {
		errs = append(errs, fmt.Errorf("minimum charge: %s must be whole seconds in 0s..1h", r.MinimumCharge))
	}
	return errors.Join(errs...)
}

// Segment is one placement of a rental, as the ledger bills it.
type Segment struct {
	RentalID string
	TenantID string
	NodeID   string
	Attempt  int32
	Plan     shizuv1.Plan
	Model    string
	Zone     string
	GPUCount int32
	// MilliGPU is the billable share of each GPU (pricing.BillableMilli).
	MilliGPU int32
	Labels   map[string]string
	// MaxSpot caps the spot price; nil means no cap.
	MaxSpot *pricing.Money
	// Start is the node-agent's started_at.
	Start time.Time
	// End is when billing stops (stopped_at, or the last heartbeat of a
	// lost node); zero while the segment runs.
	End time.Time
	// TenantEnded says the tenant's workload ended the segment (completed,
	// failed, cancelled), which makes the minimum charge apply.
	TenantEnded bool
}

// Ended reports whether the segment's end is known.
func (s Segment) Ended() bool { return !s.End.IsZero() }

// Validate reports what makes s unbillable.
func (s Segment) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.RentalID == "" || s.TenantID == "" {
		add("rental and tenant are required")
	}
	if s.Plan != shizuv1.Plan_PLAN_ON_DEMAND && s.Plan != shizuv1.Plan_PLAN_RESERVED && s.Plan != shizuv1.Plan_PLAN_SPOT {
		add("plan %s is not billable", s.Plan)
	}
	if s.GPUCount < 1 || s.GPUCount > shizuv1.MaxGPUCount {
		add("gpu_count %d is outside 1..%d", s.GPUCount, shizuv1.MaxGPUCount)
	}
	if s.MilliGPU < 1 || s.MilliGPU > shizuv1.MilliGPUWhole {
		add("milli_gpu %d is outside 1..%d", s.MilliGPU, shizuv1.MilliGPUWhole)
	}
	if s.Start.IsZero() {
		add("start is missing")
	}
	if s.Ended() && s.End.Before(s.Start) {
		add("negative duration: end %s is before start %s", s.End.Format(time.RFC3339Nano), s.Start.Format(time.RFC3339Nano))
	}
	return errors.Join(errs...)
}

// PricePoint is a spot price from an instant on.
type PricePoint struct {
	At    time.Time
	Price pricing.Money
}

// Tariff is what a segment is priced at.
type Tariff struct {
	// Base is the price per GPU-hour of the plan: on-demand list, the
	// reserved rate, or for spot the price used before the first known
	// market price of the zone.
	Base pricing.Money
	// Spot is the market price history of the segment's model and zone,
	// in any order; used only for PLAN_SPOT.
	Spot []PricePoint
}

// Record is one usage record.
type Record struct {
	ID        string
	RentalID  string
	TenantID  string
	NodeID    string
	Plan      shizuv1.Plan
	Model     string
	Start     time.Time
	End       time.Time
	Seconds   int64
	GPUCount  int32
	MilliGPU  int32
	UnitPrice pricing.Money
	Amount    pricing.Money
	Labels    map[string]string
}

// RecordID is the deterministic id of the record starting at start.
func RecordID(rentalID string, start time.Time) string {
	return "usage:" + rentalID + ":" + start.UTC().Format(time.RFC3339Nano)
}

// Close returns the records of seg that are closed by `until` and start at
// or after `from` (a cursor: the End of the last record already taken, or
// the zero time), and the next cursor. A piece is closed when its interval
// boundary (or the segment's end) is not after until. Calling Close again
// with the returned cursor continues exactly where it stopped; the records of
// any sequence of calls are the records of one call.
func Close(seg Segment, tariff Tariff, rules Rules, from, until time.Time) ([]Record, time.Time, error) {
	if err := seg.Validate(); err != nil {
		return nil, from, err
	}
	if err := rules.Validate(); err != nil {
		return nil, from, err
	}
	if err := validTariff(seg, tariff); err != nil {
		return nil, from, err
	}
	pr := pricer{seg: seg, base: tariff.Base, spot: tariffRuns(seg, tariff)}
	gm := uint64(seg.GPUCount) * uint64(seg.MilliGPU)

	a := seg.Start
	if from.After(a) {
		a = from
	}
	if seg.Ended() && a.After(seg.End) {
		return nil, from, nil
	}
	// Accrue everything before a, run by run.
	var acc accrual
	pr.accrue(&acc, gm, seg.Start, a)

	var out []Record
	cursor := from
	for {
		if seg.Ended() && !a.Before(seg.End) {
			break
		}
		b := NextBoundary(a, rules.Interval)
		if c, ok := pr.nextChange(a); ok && c.Before(b) {
			b = c
		}
		if seg.Ended() && seg.End.Before(b) {
			b = seg.End
		}
		if b.After(until) {
			break
		}
		price, billed := pr.at(a)
		n := secondsIn(seg.Start, a, b)
		if billed && n > 0 {
			before := acc.micros()
			acc.add(uint64(price.Micros)*gm, uint64(n))
			out = append(out, record(seg, a, b, n, price, acc.micros()-before))
		}
		a, cursor = b, b
	}
	if seg.Ended() && !seg.End.After(until) && !from.After(seg.End) {
		cursor = seg.End
		if minimumApplies(seg) {
			minSec := int64(rules.MinimumCharge / time.Second)
			if billed := secondsIn(seg.Start, seg.Start, seg.End); billed < minSec {
				before := acc.micros()
				missing := minSec - billed
				acc.add(uint64(tariff.Base.Micros)*gm, uint64(missing))
				out = append(out, record(seg, seg.End, seg.Start.Add(rules.MinimumCharge), missing, tariff.Base, acc.micros()-before))
				cursor = seg.Start.Add(rules.MinimumCharge)
			}
		}
	}
	return out, cursor, nil
}

// FinalCursor is where the cursor of an ended segment stands once every
// record of it is published (what Close returns then): its end, or the
// end of the top-up to the minimum charge when one is due.
func FinalCursor(seg Segment, rules Rules) time.Time {
	if minimumApplies(seg) && secondsIn(seg.Start, seg.Start, seg.End) < int64(rules.MinimumCharge/time.Second) {
		return seg.Start.Add(rules.MinimumCharge)
	}
	return seg.End
}

func minimumApplies(seg Segment) bool {
	return seg.Plan == shizuv1.Plan_PLAN_ON_DEMAND && seg.Attempt <= 1 && seg.TenantEnded
}

func record(seg Segment, a, b time.Time, seconds int64, price pricing.Money, amount int64) Record {
	return Record{
		ID: RecordID(seg.RentalID, a), RentalID: seg.RentalID, TenantID: seg.TenantID, NodeID: seg.NodeID,
		Plan: seg.Plan, Model: seg.Model, Start: a, End: b, Seconds: seconds,
		GPUCount: seg.GPUCount, MilliGPU: seg.MilliGPU, UnitPrice: price,
		Amount: pricing.Money{Micros: amount, Currency: price.Currency}, Labels: seg.Labels,
	}
}

func validTariff(seg Segment, t Tariff) error {
	if t.Base.Micros <= 0 || t.Base.Micros > pricing.MaxPriceMicros || t.Base.Currency == "" {
		return fmt.Errorf("base price %s is not a price", t.Base)
	}
	if seg.Plan != shizuv1.Plan_PLAN_SPOT {
		return nil
	}
	for _, p := range t.Spot {
		if p.Price.Currency != t.Base.Currency {
			return fmt.Errorf("spot price at %s is in %s, the catalogue in %s", p.At.Format(time.RFC3339), p.Price.Currency, t.Base.Currency)
		}
		if p.Price.Micros < 0 || p.Price.Micros > pricing.MaxPriceMicros {
			return fmt.Errorf("spot price %s at %s is outside 0..%d", p.Price, p.At.Format(time.RFC3339), int64(pricing.MaxPriceMicros))
		}
	}
	if seg.MaxSpot != nil && seg.MaxSpot.Currency != t.Base.Currency {
		return fmt.Errorf("max spot price is in %s, the catalogue in %s", seg.MaxSpot.Currency, t.Base.Currency)
	}
	return nil
}

// tariffRuns returns the spot history sorted by instant (later wins on a
// tie of instants, by price), or nil for other plans.
func tariffRuns(seg Segment, t Tariff) []PricePoint {
	if seg.Plan != shizuv1.Plan_PLAN_SPOT || len(t.Spot) == 0 {
		return nil
	}
	runs := append([]PricePoint(nil), t.Spot...)
	sort.SliceStable(runs, func(i, j int) bool {
		if !runs[i].At.Equal(runs[j].At) {
			return runs[i].At.Before(runs[j].At)
		}
		return runs[i].Price.Micros < runs[j].Price.Micros
	})
	// Keep the last of equal instants.
	dedup := runs[:0]
	for i, p := range runs {
		if i+1 < len(runs) && runs[i+1].At.Equal(p.At) {
			continue
		}
		dedup = append(dedup, p)
	}
	return dedup
}

// pricer answers the price in force at an instant.
type pricer struct {
	seg  Segment
	base pricing.Money
	spot []PricePoint
}

// at returns the price of the second starting at t and whether that second
// is billed (a spot price above the tenant's maximum is not).
func (p pricer) at(t time.Time) (pricing.Money, bool) {
	if p.seg.Plan != shizuv1.Plan_PLAN_SPOT {
		return p.base, true
	}
	i := sort.Search(len(p.spot), func(i int) bool { return p.spot[i].At.After(t) }) - 1
	price := p.base
	if i >= 0 {
		price = p.spot[i].Price
	}
	if p.seg.MaxSpot != nil && price.Micros > p.seg.MaxSpot.Micros {
		return price, false
	}
	return price, true
}

// nextChange is the first spot change strictly after t, or the zero time.
func (p pricer) nextChange(t time.Time) (time.Time, bool) {
	i := sort.Search(len(p.spot), func(i int) bool { return p.spot[i].At.After(t) })
	if i == len(p.spot) {
		return time.Time{}, false
	}
	return p.spot[i].At, true
}

// accrue adds the usage of the seconds starting in [x, y) to acc.
func (p pricer) accrue(acc *accrual, gm uint64, x, y time.Time) {
	for x.Before(y) {
		b := y
		if c, ok := p.nextChange(x); ok && c.Before(b) {
			b = c
		}
		if price, billed := p.at(x); billed {
			if n := secondsIn(p.seg.Start, x, b); n > 0 {
				acc.add(uint64(price.Micros)*gm, uint64(n))
			}
		}
		x = b
	}
}

// secondsIn counts the seconds of a segment starting at start whose first
// instant lies in [x, y), for start <= x <= y.
func secondsIn(start, x, y time.Time) int64 {
	return ceilSeconds(y.Sub(start)) - ceilSeconds(x.Sub(start))
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// NextBoundary is the first multiple of interval (whole seconds) since the
// Unix epoch that is strictly after t. It floors, so it holds before 1970
// too: the boundary after -0.5 s is 0, not one interval later.
func NextBoundary(t time.Time, interval time.Duration) time.Time {
	sec := t.Unix() // floors: the nanoseconds of a Time are never negative
	step := int64(interval / time.Second)
	k := sec / step
	if sec < 0 && sec%step != 0 {
		k--
	}
	return time.Unix((k+1)*step, 0).UTC()
}
