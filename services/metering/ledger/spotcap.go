package ledger

import (
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// SecondsAboveMax counts the seconds of seg starting in [from, to) that
// Close does not bill because the spot price in force at their first
// instant is above the tenant's maximum (the rental should have been
// preempted, or never placed). Zero for other plans and without a maximum.
// It is how an operator sees a spot rental running unbilled.
func SecondsAboveMax(seg Segment, tariff Tariff, from, to time.Time) int64 {
	if seg.Plan != shizuv1.Plan_PLAN_SPOT || seg.MaxSpot == nil {
		return 0
	}
	pr := pricer{seg: seg, base: tariff.Base, spot: tariffRuns(seg, tariff)}
	x := seg.Start
	if from.After(x) {
		x = from
	}
	if seg.Ended() && to.After(seg.End) {
		to = seg.End
	}
	var n int64
	for x.Before(to) {
		b := to
		if c, ok := pr.nextChange(x); ok && c.Before(b) {
			b = c
		}
		if _, billed := pr.at(x); !billed {
			n += secondsIn(seg.Start, x, b)
		}
		x = b
	}
	return n
}
