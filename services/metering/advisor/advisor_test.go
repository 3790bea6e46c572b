package advisor_test

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/advisor"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
)

var monday = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

// nightAndDay is a spot market at 0.80 per GPU-hour from 22:00 to 06:00 and
// 1.60 by day, against 2.50 on demand.
func nightAndDay() advisor.Market {
	m := advisor.Market{Currency: "USD", OnDemandMicros: 2_500_000}
	for h := range m.SpotByHourMicros {
		m.SpotByHourMicros[h] = 1_600_000
		if h >= 22 || h < 6 {
			m.SpotByHourMicros[h] = 800_000
		}
	}
	return m
}

// The founding text's case: a team that moves training to spot and tuning
// to per-second cuts one development round from 23,000 to about 8,000.
// Assumptions this test encodes:
//   - one round is 8,000 GPU-hours of checkpointed training on 64 GPUs and
//     150 tuning sessions of 20 minutes on 8 GPUs, within three weeks;
//   - on demand costs 2.50 per GPU-hour; spot 0.80 at night (22-06 UTC)
//     and 1.60 by day;
//   - the old way bills training on demand and each tuning session in whole
//     hours (8,000 x 2.50 + 150 x 8 x 1 h x 2.50 = 23,000);
//   - on spot, interruptions cost 10 % extra GPU time (restarts from the
//     last checkpoint).
func TestFoundingCaseCutsARoundFrom23000ToAbout8000(t *testing.T) {
	t.Parallel()
	w := advisor.Workload{TrainingGPUHours: 8000, TrainingGPUs: 64, SpotOverheadPercent: 10,
		TuningSessions: 150, SessionLength: 20 * time.Minute, SessionGPUs: 8,
		From: monday, Deadline: monday.AddDate(0, 0, 21)}
	adv, err := advisor.Advise(w, nightAndDay())
	if err != nil {
		t.Fatalf("advise: %v", err)
	}
	if adv.AllOnDemandMicros != 23_000_000_000 {
		t.Fatalf("all on demand costs %d µ, want 23,000", adv.AllOnDemandMicros)
	}
	// 8,800 spot GPU-hours at 0.80 = 7,040, plus 400 tuning GPU-hours at
	// 2.50 = 1,000: 8,040.
	if adv.TotalMicros < 7_500_000_000 || adv.TotalMicros > 8_500_000_000 {
		t.Fatalf("the advice costs %d µ, want about 8,000", adv.TotalMicros)
	}
	if adv.SavingMicros != adv.AllOnDemandMicros-adv.TotalMicros {
		t.Fatalf("saving %d is not the difference", adv.SavingMicros)
	}
	for _, b := range adv.Blocks {
		if b.What != "training" {
			continue
		}
		if h := b.Start.Hour(); b.Plan != shizuv1.Plan_PLAN_SPOT || (h >= 6 && h < 22) {
			t.Fatalf("training block %+v is not on spot at night", b)
		}
		if b.End.After(w.Deadline) {
			t.Fatalf("training block %+v ends after the deadline", b)
		}
	}
}

func TestTrainingThatCannotFitBeforeTheDeadlineIsRefused(t *testing.T) {
	t.Parallel()
	w := advisor.Workload{TrainingGPUHours: 10_000, TrainingGPUs: 8, From: monday, Deadline: monday.Add(24 * time.Hour)}
	if _, err := advisor.Advise(w, nightAndDay()); err == nil {
		t.Fatal("accepted 10,000 GPU-hours on 8 GPUs in one day")
	}
}

func TestSpotByHourAveragesTheRecentHistory(t *testing.T) {
	t.Parallel()
	usd := func(m int64) pricing.Money { return pricing.Money{Micros: m, Currency: "USD"} }
	hist := []ledger.PricePoint{{At: monday, Price: usd(1_000_000)}, {At: monday.Add(30 * time.Minute), Price: usd(2_000_000)}}
	by := advisor.SpotByHour(hist, 9_000_000, monday, monday.Add(2*time.Hour))
	if by[0] != 1_500_000 || by[1] != 2_000_000 || by[5] != 9_000_000 {
		t.Fatalf("by hour %v", by[:6])
	}
}

func TestPropertyAdviceNeverCostsMoreThanAllOnDemand(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		m := advisor.Market{Currency: "USD", OnDemandMicros: rapid.Int64Range(1, 10_000_000).Draw(t, "od")}
		for h := range m.SpotByHourMicros {
			m.SpotByHourMicros[h] = rapid.Int64Range(0, 20_000_000).Draw(t, "spot")
		}
		w := advisor.Workload{TrainingGPUHours: rapid.Int64Range(0, 5000).Draw(t, "train"),
			TrainingGPUs: rapid.Int32Range(1, 64).Draw(t, "gpus"), SpotOverheadPercent: 0,
			TuningSessions: rapid.Int64Range(0, 200).Draw(t, "sessions"),
			SessionLength:  time.Duration(rapid.Int64Range(1, 7200).Draw(t, "len")) * time.Second,
			SessionGPUs:    rapid.Int32Range(1, 8).Draw(t, "sgpus"), From: monday, Deadline: monday.AddDate(0, 0, 30)}
		adv, err := advisor.Advise(w, m)
		if err != nil {
			return // does not fit: refused, nothing to compare
		}
		if adv.TotalMicros > adv.AllOnDemandMicros+int64(len(adv.Blocks)) { // one micro of rounding per block
			t.Fatalf("advice %d µ costs more than all on demand %d µ", adv.TotalMicros, adv.AllOnDemandMicros)
		}
	})
}
