package ledger_test

import (
	"math/big"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

var epoch = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func usd(micros int64) pricing.Money { return pricing.Money{Micros: micros, Currency: "USD"} }

func segment() ledger.Segment {
	return ledger.Segment{RentalID: "r-1", TenantID: "acme", NodeID: "node-1", Attempt: 1,
		Plan: shizuv1.Plan_PLAN_ON_DEMAND, Model: "H100-SXM5-80GB", Zone: "eu-1", GPUCount: 1, MilliGPU: 1000,
		Start: epoch.Add(10*time.Second + 500*time.Millisecond)}
}

func sum(recs []ledger.Record) (seconds, micros int64) {
	for _, r := range recs {
		seconds += r.Seconds
		micros += r.Amount.Micros
	}
	return
}

func closeAll(t testing.TB, seg ledger.Segment, tariff ledger.Tariff, rules ledger.Rules) []ledger.Record {
	t.Helper()
	recs, _, err := ledger.Close(seg, tariff, rules, time.Time{}, seg.End.Add(24*time.Hour))
	if err != nil {
		t.Fatalf("close: %v", err)
	}
	return recs
}

func TestOnDemandBillsEverySecondStartedAtTheListPrice(t *testing.T) {
	t.Parallel()
	seg := segment()
	seg.End = seg.Start.Add(150*time.Second + 200*time.Millisecond) // 151 billed seconds
	seg.TenantEnded = true
	recs := closeAll(t, seg, ledger.Tariff{Base: usd(2_490_000)}, ledger.DefaultRules())
	secs, micros := sum(recs)
	if secs != 151 {
		t.Fatalf("billed %d seconds, want 151", secs)
	}
	if want := ledger.AmountMicros(2_490_000, 1, 1000, 151); micros != want {
		t.Fatalf("billed %d micros, want %d", micros, want)
	}
	// Pieces are cut at minute boundaries: [10.5,60) [60,120) [120,160.7).
	if len(recs) != 3 || !recs[1].Start.Equal(epoch.Add(time.Minute)) || !recs[2].End.Equal(seg.End) {
		t.Fatalf("records not cut at minute boundaries: %+v", recs)
	}
	for _, r := range recs {
		if err := r.Proto("metering").Validate(); err != nil {
			t.Fatalf("record %s does not validate: %v", r.ID, err)
		}
	}
	if recs[0].ID != "usage:r-1:2026-11-01T00:00:10.5Z" {
		t.Fatalf("record id %q is not the documented scheme", recs[0].ID)
	}
}

func TestShortOnDemandRentalIsToppedUpToTheMinimumCharge(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		attempt     int32
		tenantEnded bool
		wantSeconds int64
	}{
		{"a workload that ends itself after 12 s pays for 60 s", 1, true, 60},
		{"a rental the platform stopped pays only its 12 s", 1, false, 12},
		{"a re-placed rental pays only its 12 s", 2, true, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seg := segment()
			seg.Attempt, seg.TenantEnded = tc.attempt, tc.tenantEnded
			seg.End = seg.Start.Add(11*time.Second + time.Millisecond)
			recs := closeAll(t, seg, ledger.Tariff{Base: usd(3_600_000)}, ledger.DefaultRules())
			secs, micros := sum(recs)
			if secs != tc.wantSeconds || micros != tc.wantSeconds*1000 {
				t.Fatalf("billed %d s / %d µ, want %d s / %d µ", secs, micros, tc.wantSeconds, tc.wantSeconds*1000)
			}
			for _, r := range recs {
				if err := r.Proto("metering").Validate(); err != nil {
					t.Fatalf("record %s does not validate: %v", r.ID, err)
				}
			}
		})
	}
}

func TestSpotIsBilledAtThePriceInForceEachSecondAndNotAboveTheMaximum(t *testing.T) {
	t.Parallel()
	seg := segment()
	seg.Plan = shizuv1.Plan_PLAN_SPOT
	seg.Start = epoch
	seg.End = epoch.Add(3 * time.Minute)
	max := usd(2_000_000)
	seg.MaxSpot = &max
	tariff := ledger.Tariff{Base: usd(9_000_000), Spot: []ledger.PricePoint{
		{At: epoch.Add(-time.Hour), Price: usd(1_000_000)},
		{At: epoch.Add(90 * time.Second), Price: usd(3_000_000)},  // above max: not billed
		{At: epoch.Add(150 * time.Second), Price: usd(1_800_000)}, // back under
	}}
	recs := closeAll(t, seg, tariff, ledger.DefaultRules())
	secs, micros := sum(recs)
	if secs != 90+30 {
		t.Fatalf("billed %d seconds, want 120 (60 s above the maximum skipped)", secs)
	}
	if want := int64(90*1_000_000/3600 + 30*1_800_000/3600); micros != want {
		t.Fatalf("billed %d micros, want %d", micros, want)
	}
}

func TestBadSegmentsAreRefusedWithAReason(t *testing.T) {
	t.Parallel()
	neg := segment()
	neg.End = neg.Start.Add(-time.Second)
	_, _, err := ledger.Close(neg, ledger.Tariff{Base: usd(1)}, ledger.DefaultRules(), time.Time{}, neg.Start.Add(time.Hour))
	if err == nil || !strings.Contains(err.Error(), "negative duration") {
		t.Fatalf("negative duration: got %v", err)
	}
	spot := segment()
	spot.Plan = shizuv1.Plan_PLAN_SPOT
	_, _, err = ledger.Close(spot, ledger.Tariff{Base: usd(1), Spot: []ledger.PricePoint{{At: epoch, Price: pricing.Money{Micros: 1, Currency: "EUR"}}}},
		ledger.DefaultRules(), time.Time{}, spot.Start.Add(time.Hour))
	if err == nil || !strings.Contains(err.Error(), "EUR") {
		t.Fatalf("spot price in another currency: got %v", err)
	}
}

// genSegment draws a segment with a random timeline.
func genSegment(t *rapid.T) ledger.Segment {
	seg := segment()
	seg.Plan = rapid.SampledFrom([]shizuv1.Plan{shizuv1.Plan_PLAN_ON_DEMAND, shizuv1.Plan_PLAN_RESERVED, shizuv1.Plan_PLAN_SPOT}).Draw(t, "plan")
	seg.Attempt = rapid.Int32Range(1, 3).Draw(t, "attempt")
	seg.TenantEnded = rapid.Bool().Draw(t, "tenantEnded")
	seg.GPUCount = rapid.Int32Range(1, 64).Draw(t, "gpus")
	seg.MilliGPU = 1000
	if seg.GPUCount == 1 {
		seg.MilliGPU = rapid.Int32Range(1, 1000).Draw(t, "milli")
	}
	seg.Start = epoch.Add(drawDuration(t, "start", 3600))
	seg.End = seg.Start.Add(drawDuration(t, "duration", 3*3600))
	return seg
}

func genTariff(t *rapid.T, seg ledger.Segment) ledger.Tariff {
	tariff := ledger.Tariff{Base: usd(rapid.Int64Range(1, pricing.MaxPriceMicros).Draw(t, "base"))}
	if seg.Plan == shizuv1.Plan_PLAN_SPOT {
		n := rapid.IntRange(0, 20).Draw(t, "changes")
		for i := range n {
			_ = i
			at := epoch.Add(-time.Hour + drawDuration(t, "at", 5*3600))
			tariff.Spot = append(tariff.Spot, ledger.PricePoint{At: at, Price: usd(rapid.Int64Range(0, 50_000_000).Draw(t, "price"))})
		}
	}
	return tariff
}

// drawDuration draws whole seconds up to maxSeconds (spread over their
// range, not only the small end) plus a fraction of a second.
func drawDuration(t *rapid.T, label string, maxSeconds int) time.Duration {
	scale := rapid.SampledFrom([]int{10, 100, 1000, maxSeconds}).Draw(t, label+"-scale")
	secs := rapid.IntRange(0, min(scale, maxSeconds)).Draw(t, label+"-s")
	frac := rapid.SampledFrom([]int64{0, 1, 500_000_000, 999_999_999}).Draw(t, label+"-frac")
	if rapid.Bool().Draw(t, label+"-anyfrac") {
		frac = rapid.Int64Range(0, int64(time.Second)-1).Draw(t, label+"-ns")
	}
	return time.Duration(secs)*time.Second + time.Duration(frac)
}

// expected prices the segment second by second, independently of how the
// ledger cuts it into records.
func expected(seg ledger.Segment, tariff ledger.Tariff, rules ledger.Rules) (seconds, micros int64) {
	perPrice := map[int64]int64{}
	n := int64((seg.End.Sub(seg.Start) + time.Second - 1) / time.Second)
	for k := range n {
		at := seg.Start.Add(time.Duration(k) * time.Second)
		price := tariff.Base.Micros
		if seg.Plan == shizuv1.Plan_PLAN_SPOT {
			var best *ledger.PricePoint
			for i := range tariff.Spot {
				p := &tariff.Spot[i]
				if !p.At.After(at) && (best == nil || p.At.After(best.At) || (p.At.Equal(best.At) && p.Price.Micros > best.Price.Micros)) {
					best = p
				}
			}
			if best != nil {
				price = best.Price.Micros
			}
			if seg.MaxSpot != nil && price > seg.MaxSpot.Micros {
				continue
			}
		}
		perPrice[price]++
		seconds++
	}
	minSec := int64(rules.MinimumCharge / time.Second)
	if seg.Plan == shizuv1.Plan_PLAN_ON_DEMAND && seg.Attempt == 1 && seg.TenantEnded && seconds < minSec {
		perPrice[tariff.Base.Micros] += minSec - seconds
		seconds = minSec
	}
	return seconds, exactTotal(perPrice, int64(seg.GPUCount)*int64(seg.MilliGPU))
}

// exactTotal is Σ price×seconds×gm over 3,600,000 (micro-units per
// GPU-hour of milli-GPUs), rounded half up once, in arbitrary precision:
// an oracle independent of the ledger's 128-bit accrual.
func exactTotal(perPrice map[int64]int64, gm int64) int64 {
	num := new(big.Int)
	for price, seconds := range perPrice {
		term := new(big.Int).Mul(big.NewInt(price), big.NewInt(seconds))
		num.Add(num, term.Mul(term, big.NewInt(gm)))
	}
	return roundHalfUp(num, 3600*1000)
}

func roundHalfUp(num *big.Int, divisor int64) int64 {
	d := big.NewInt(divisor)
	q, r := new(big.Int).QuoRem(num, d, new(big.Int))
	if r.Mul(r, big.NewInt(2)).Cmp(d) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func TestAmountsWhoseProductOverflows64BitsAreExact(t *testing.T) {
	t.Parallel()
	// price × gpus × milli × seconds beyond 2^64: the accrual's 128-bit
	// intermediate must carry it; math/big says what it must be.
	cases := []struct {
		name    string
		price   int64
		gpus    int32
		milli   int32
		seconds int64
	}{
		{"the highest price on the most GPUs for a month", pricing.MaxPriceMicros, shizuv1.MaxGPUCount, 1000, 31 * 24 * 3600},
		{"the highest price on one GPU for a year", pricing.MaxPriceMicros, 1, 1000, 366 * 24 * 3600},
		{"a price whose product lands just past 2^64", 9_999_999_999, 64, 999, 28_871},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			num := new(big.Int).Mul(big.NewInt(tc.price), big.NewInt(int64(tc.gpus)*int64(tc.milli)))
			num.Mul(num, big.NewInt(tc.seconds))
			if num.BitLen() <= 64 {
				t.Fatalf("product %s fits in 64 bits: the case does not test the overflow path", num)
			}
			want := roundHalfUp(num, 3600*1000)
			if got := ledger.AmountMicros(tc.price, tc.gpus, tc.milli, tc.seconds); got != want {
				t.Fatalf("amount %d µ, want %d µ", got, want)
			}
			seg := segment()
			seg.GPUCount, seg.MilliGPU = tc.gpus, tc.milli
			seg.Start = epoch
			seg.End = epoch.Add(time.Duration(tc.seconds) * time.Second)
			rules := ledger.Rules{Interval: 24 * time.Hour}
			if _, micros := sum(closeAll(t, seg, ledger.Tariff{Base: usd(tc.price)}, rules)); micros != want {
				t.Fatalf("records add up to %d µ, want %d µ", micros, want)
			}
		})
	}
}

func TestNextBoundaryIsTheFirstMultipleOfTheIntervalStrictlyAfter(t *testing.T) {
	t.Parallel()
	unix := func(sec, nsec int64) time.Time { return time.Unix(sec, nsec).UTC() }
	cases := []struct {
		name     string
		at       time.Time
		interval time.Duration
		want     time.Time
	}{
		{"an instant inside an interval ends at its boundary", unix(90, 0), time.Minute, unix(120, 0)},
		{"an instant on a boundary goes to the next", unix(120, 0), time.Minute, unix(180, 0)},
		{"half a second after the epoch ends at the first boundary", unix(0, 500_000_000), time.Minute, unix(60, 0)},
		{"half a second before the epoch ends at the epoch", unix(-1, 500_000_000), time.Minute, unix(0, 0)},
		{"a second before the epoch ends at the epoch", unix(-1, 0), time.Minute, unix(0, 0)},
		{"a negative boundary goes to the next", unix(-60, 0), time.Minute, unix(0, 0)},
		{"ninety seconds before the epoch ends a minute before it", unix(-90, 0), time.Minute, unix(-60, 0)},
		{"a time before 1970 with an hourly interval", time.Date(1969, 12, 31, 22, 30, 0, 0, time.UTC), time.Hour, time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC)},
		{"a time zone does not move the boundary", time.Date(2026, 11, 1, 10, 30, 5, 0, time.FixedZone("x", 5400)), time.Hour, time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.NextBoundary(tc.at, tc.interval); !got.Equal(tc.want) {
				t.Fatalf("after %s: %s, want %s", tc.at.Format(time.RFC3339Nano), got.Format(time.RFC3339Nano), tc.want.Format(time.RFC3339Nano))
			}
		})
	}
}

func TestPropertyRecordsAddUpToPriceTimesSecondsToTheMicroUnit(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		seg := genSegment(t)
		tariff := genTariff(t, seg)
		if seg.Plan == shizuv1.Plan_PLAN_SPOT && rapid.Bool().Draw(t, "capped") {
			m := usd(rapid.Int64Range(0, 50_000_000).Draw(t, "max"))
			seg.MaxSpot = &m
		}
		rules := ledger.Rules{Interval: time.Duration(rapid.SampledFrom([]int64{1, 15, 60, 3600}).Draw(t, "interval")) * time.Second,
			MinimumCharge: time.Duration(rapid.Int64Range(0, 3600).Draw(t, "minimum")) * time.Second}
		recs, _, err := ledger.Close(seg, tariff, rules, time.Time{}, seg.End)
		if err != nil {
			t.Fatalf("close: %v", err)
		}
		secs, micros := sum(recs)
		wantSecs, wantMicros := expected(seg, tariff, rules)
		if secs != wantSecs || micros != wantMicros {
			t.Fatalf("records bill %d s / %d µ, per-second pricing says %d s / %d µ", secs, micros, wantSecs, wantMicros)
		}
		seen := map[string]bool{}
		for _, r := range recs {
			if seen[r.ID] {
				t.Fatalf("record id %s twice", r.ID)
			}
			seen[r.ID] = true
			if err := r.Proto("metering").Validate(); err != nil {
				t.Fatalf("record %s does not validate: %v", r.ID, err)
			}
		}
	})
}

func TestPropertyClosingInStepsGivesTheRecordsOfOneClose(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		seg := genSegment(t)
		tariff := genTariff(t, seg)
		rules := ledger.DefaultRules()
		whole, _, err := ledger.Close(seg, tariff, rules, time.Time{}, seg.End.Add(time.Hour))
		if err != nil {
			t.Fatalf("close: %v", err)
		}
		var steps []ledger.Record
		var cursor time.Time
		until := seg.Start
		for range 200 {
			until = until.Add(time.Duration(rapid.Int64Range(0, int64(30*time.Minute)).Draw(t, "step")))
			recs, next, err := ledger.Close(seg, tariff, rules, cursor, until)
			if err != nil {
				t.Fatalf("close: %v", err)
			}
			steps = append(steps, recs...)
			cursor = next
			if until.After(seg.End.Add(time.Hour)) {
				break
			}
		}
		recs, _, _ := ledger.Close(seg, tariff, rules, cursor, seg.End.Add(time.Hour))
		steps = append(steps, recs...)
		// Once finished, closing again from the cursor adds nothing.
		again, _, _ := ledger.Close(seg, tariff, rules, cursor, seg.End.Add(48*time.Hour))
		if len(again) != 0 && len(recs) == 0 {
			t.Fatalf("closing a finished segment again added %d records", len(again))
		}
		if len(steps) != len(whole) {
			t.Fatalf("closing in steps gave %d records, one close %d", len(steps), len(whole))
		}
		for i := range whole {
			if steps[i].ID != whole[i].ID || steps[i].Amount != whole[i].Amount || steps[i].Seconds != whole[i].Seconds {
				t.Fatalf("record %d differs: steps %+v, whole %+v", i, steps[i], whole[i])
			}
		}
	})
}

func TestANodeLostBeforeItsFirstHeartbeatAfterTheStartBillsNothing(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 6, 18, 12, 0, 0, 0, time.UTC)
	st := ledger.SegmentState{RentalID: "r", Attempt: 1, Scheduled: true, StartedAt: start, LostAt: start.Add(-300 * time.Millisecond)}
	if end := st.End(); !end.Equal(start) {
		t.Fatalf("end %s, want the start %s: the loss came before any beat of this run", end, start)
	}
	st.LostAt = start.Add(90 * time.Second)
	st.StoppedAt = start.Add(5 * time.Minute) // the zombie's late stop
	if end := st.End(); !end.Equal(st.LostAt) {
		t.Fatalf("end %s, want the last heartbeat %s", end, st.LostAt)
	}
}
