package ledger_test

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

func catalogue(t testing.TB) *pricing.Catalogue {
	t.Helper()
	c, err := pricing.Parse([]byte(`{"currency": "USD", "reserved_discount_percent": {"month": 60, "year": 70},
		"instance_types": [
			{"model": "H100-SXM5-80GB", "vram_mib": 81920, "price_per_gpu_hour_micros": 2500000},
			{"model": "A100-SXM4-80GB", "vram_mib": 81920, "price_per_gpu_hour_micros": 1600000}]}`))
	if err != nil {
		t.Fatalf("catalogue: %v", err)
	}
	return c
}

func TestReservedUsageInsideTheCommitmentCostsTheCommitmentOnly(t *testing.T) {
	t.Parallel()
	cat := catalogue(t)
	period := epoch
	// 2 GPUs committed for a month (30 days in November), 60 % off 2.50.
	c := ledger.Commitment{TenantID: "acme", Model: "H100-SXM5-80GB", GPUCount: 2, Term: pricing.TermMonth, Start: period}
	committed := int64(2 * 1000 * 30 * 24 * 3600)
	cases := []struct {
		name          string
		used          int64
		wantReserved  int64
		wantOnDemand  int64
		wantOverageQt int64
	}{
		{"unused committed hours are still owed", 0, 2 * 1_000_000 * 720, 0, 0},
		{"usage inside the commitment adds nothing", committed / 2, 2 * 1_000_000 * 720, 0, 0},
		{"usage beyond the commitment is billed on demand", committed + 1000*3600, 2 * 1_000_000 * 720, 2_500_000, 1000 * 3600},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inv, err := ledger.BuildInvoice(cat, "acme", period, period.AddDate(0, 1, 0),
				[]ledger.Usage{{Plan: shizuv1.Plan_PLAN_RESERVED, Model: "H100-SXM5-80GB", MilliGPUSeconds: tc.used}}, []ledger.Commitment{c})
			if err != nil {
				t.Fatalf("invoice: %v", err)
			}
			var res, od ledger.Line
			for _, l := range inv.Lines {
				switch l.Plan {
				case shizuv1.Plan_PLAN_RESERVED:
					res = l
				case shizuv1.Plan_PLAN_ON_DEMAND:
					od = l
				}
			}
			if res.Amount.Micros != tc.wantReserved || od.Amount.Micros != tc.wantOnDemand || od.MilliGPUSeconds != tc.wantOverageQt {
				t.Fatalf("reserved %d, on-demand %d (%d mGs); want %d, %d (%d)", res.Amount.Micros, od.Amount.Micros, od.MilliGPUSeconds,
					tc.wantReserved, tc.wantOnDemand, tc.wantOverageQt)
			}
			if inv.Total.Micros != tc.wantReserved+tc.wantOnDemand {
				t.Fatalf("total %d is not the sum of its lines", inv.Total.Micros)
			}
			if err := inv.Proto("metering").Validate(); err != nil {
				t.Fatalf("invoice does not validate: %v", err)
			}
		})
	}
}

func TestPropertyReservedBillIsCommitmentPlusOverageAtOnDemand(t *testing.T) {
	t.Parallel()
	cat := catalogue(t)
	rapid.Check(t, func(t *rapid.T) {
		gpus := rapid.Int32Range(1, 64).Draw(t, "gpus")
		term := rapid.SampledFrom([]pricing.Term{pricing.TermMonth, pricing.TermYear}).Draw(t, "term")
		discount := rapid.Int64Range(60, 80).Draw(t, "discount")
		start := epoch.Add(time.Duration(rapid.IntRange(-90, 30).Draw(t, "startDay")) * 24 * time.Hour)
		c := ledger.Commitment{TenantID: "acme", Model: "A100-SXM4-80GB", GPUCount: gpus, Term: term, Start: start, DiscountPercent: discount}
		periodStart, periodEnd := epoch, epoch.AddDate(0, 1, 0)
		used := rapid.Int64Range(0, int64(gpus)*2*1000*31*86400).Draw(t, "used")
		inv, err := ledger.BuildInvoice(cat, "acme", periodStart, periodEnd,
			[]ledger.Usage{{Plan: shizuv1.Plan_PLAN_RESERVED, Model: "A100-SXM4-80GB", MilliGPUSeconds: used}}, []ledger.Commitment{c})
		if err != nil {
			t.Fatalf("invoice: %v", err)
		}
		// Committed quantity inside the period.
		s, e := c.Start, c.End()
		if s.Before(periodStart) {
			s = periodStart
		}
		if e.After(periodEnd) {
			e = periodEnd
		}
		var committed int64
		if e.After(s) {
			committed = int64(gpus) * 1000 * int64(e.Sub(s)/time.Second)
		}
		rate, _ := cat.Reserved("A100-SXM4-80GB", term, discount)
		want := ledger.AmountMicros(rate.Micros, 1, 1, committed)
		if over := used - committed; over > 0 {
			want += ledger.AmountMicros(1_600_000, 1, 1, over)
		}
		if inv.Total.Micros != want {
			t.Fatalf("total %d, want commitment + overage %d (used %d, committed %d)", inv.Total.Micros, want, used, committed)
		}
	})
}

func TestBudgetThresholdsInPercentAreOfTheAmountRoundedDown(t *testing.T) {
	t.Parallel()
	b := ledger.Budget{TenantID: "acme", Currency: "USD", AmountMicros: 1_000_000_001, ThresholdsPercent: []int32{100, 50, 80},
		ThresholdsMicros: []int64{800_000_000, 10}}
	got := b.Thresholds()
	want := []ledger.Threshold{{Micros: 10}, {Micros: 500_000_000, Percent: 50}, {Micros: 800_000_000, Percent: 80}, {Micros: 1_000_000_001, Percent: 100}}
	if len(got) != len(want) {
		t.Fatalf("thresholds %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("thresholds %v, want %v", got, want)
		}
	}
	if r := b.Reached(800_000_000); len(r) != 3 || r[2].Percent != 80 {
		t.Fatalf("reached at 800 USD: %v, want 10 µ, 50 %% and 80 %%", r)
	}
	if r := b.Reached(9); len(r) != 0 {
		t.Fatalf("reached at 9 µ: %v, want none", r)
	}
}
