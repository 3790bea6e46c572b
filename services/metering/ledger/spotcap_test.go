package ledger_test

import (
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

func TestSecondsAboveTheMaximumAreCountedAndTheRestBilled(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	usd := func(m int64) pricing.Money { return pricing.Money{Micros: m, Currency: "USD"} }
	tariff := ledger.Tariff{Base: usd(2_490_000), Spot: []ledger.PricePoint{
		{At: t0.Add(-time.Hour), Price: usd(900_000)},
		{At: t0.Add(30*time.Second + 250*time.Millisecond), Price: usd(1_400_000)},
		{At: t0.Add(100 * time.Second), Price: usd(700_000)},
	}}
	maxPrice := usd(1_000_000)
	seg := ledger.Segment{RentalID: "r", TenantID: "t", Plan: shizuv1.Plan_PLAN_SPOT, GPUCount: 1, MilliGPU: 1000,
		MaxSpot: &maxPrice, Start: t0, End: t0.Add(150 * time.Second)}
	cases := []struct {
		name     string
		seg      ledger.Segment
		from, to time.Time
		want     int64
	}{
		// Seconds 31..100 start at or after the change to 1.40 at 30.25 s.
		{"the seconds priced above the maximum over the whole run", seg, time.Time{}, t0.Add(time.Hour), 69},
		{"only those in the range", seg, t0.Add(time.Minute), t0.Add(2 * time.Minute), 40},
		{"none without a maximum", func() ledger.Segment { s := seg; s.MaxSpot = nil; return s }(), time.Time{}, t0.Add(time.Hour), 0},
		{"none on demand", func() ledger.Segment { s := seg; s.Plan = shizuv1.Plan_PLAN_ON_DEMAND; return s }(), time.Time{}, t0.Add(time.Hour), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.SecondsAboveMax(tc.seg, tariff, tc.from, tc.to); got != tc.want {
				t.Fatalf("SecondsAboveMax = %d, want %d", got, tc.want)
			}
		})
	}
	// What is not counted is billed: 150 seconds in all.
	recs, _, err := ledger.Close(seg, tariff, ledger.DefaultRules(), time.Time{}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var billed int64
	for _, r := range recs {
		billed += r.Seconds
	}
	if billed+ledger.SecondsAboveMax(seg, tariff, time.Time{}, t0.Add(time.Hour)) != 150 {
		t.Fatalf("billed %d seconds; with those above the maximum want 150", billed)
	}
}
