// Package advisor recommends the cheapest plan mix and schedule for a
// development round: interruptible training on spot in the hours the
// market is cheapest, interactive tuning on demand billed by the second,
// and what that saves against running everything on demand with whole-hour
// billing. It is pure: it takes the workload, prices and the time window and
// returns the advice.
package advisor

import (
	"errors"
	"fmt"
	"sort"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
)

// Workload is one development round.
type Workload struct {
	// TrainingGPUHours of checkpointed, interruptible training.
	TrainingGPUHours int64
	// TrainingGPUs run the training in parallel.
	TrainingGPUs int32
	// SpotOverheadPercent is the extra GPU time training needs on spot to
	// redo work lost at interruptions (since the last checkpoint).
	SpotOverheadPercent int64
	// Tuning is interactive work: Sessions of SessionLength on SessionGPUs,
	// during the day.
	TuningSessions int64
	SessionLength  time.Duration
	SessionGPUs    int32
	// From and Deadline bound the round; training must finish by Deadline.
	From, Deadline time.Time
}

// Validate reports every problem in w.
func (w Workload) Validate() error {
	var errs []error
	if w.TrainingGPUHours < 0 || w.TuningSessions < 0 || w.SessionLength < 0 || w.SpotOverheadPercent < 0 {
		errs = append(errs, errors.New("quantities must not be negative"))
	}
	if w.TrainingGPUHours > 0 && w.TrainingGPUs < 1 {
		errs = append(errs, errors.New("training needs at least one GPU"))
	}
	if w.TuningSessions > 0 && (w.SessionGPUs < 1 || w.SessionLength <= 0) {
		errs = append(errs, errors.New("tuning sessions need GPUs and a length"))
	}
	if !w.Deadline.After(w.From) {
		errs = append(errs, fmt.Errorf("deadline %s is not after the start %s", w.Deadline.Format(time.RFC3339), w.From.Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// Market is what the round can be bought at: the on-demand list price and
// the recent spot price by hour of day (UTC), all per GPU-hour in micros
// of one currency.
type Market struct {
	Currency         string
	OnDemandMicros   int64
	SpotByHourMicros [24]int64
}

// SpotByHour averages a spot price history into a price per hour of day
// (time-weighted over [from, to)); hours with no price get the on-demand
// price, which never makes spot look cheaper than it was.
func SpotByHour(history []ledger.PricePoint, onDemand int64, from, to time.Time) [24]int64 {
	sorted := append([]ledger.PricePoint(nil), history...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].At.Before(sorted[j].At) })
	var sum, secs [24]int64
	price := onDemand
	i := 0
	for t := from; t.Before(to); t = t.Add(time.Minute) {
		for i < len(sorted) && !sorted[i].At.After(t) {
			price = sorted[i].Price.Micros
			i++
		}
		h := t.UTC().Hour()
		sum[h] += price * 60
		secs[h] += 60
	}
	var out [24]int64
	for h := range out {
		if secs[h] == 0 {
			out[h] = onDemand
			continue
		}
		out[h] = (sum[h] + secs[h]/2) / secs[h]
	}
	return out
}

// Block is one stretch of the recommended schedule.
type Block struct {
	What   string // "training" or "tuning"
	Plan   shizuv1.Plan
	Start  time.Time
	End    time.Time
	GPUs   int32
	Micros int64
}

// Advice is the recommended schedule and its cost.
type Advice struct {
	Blocks []Block
	// TotalMicros is the recommendation's cost; AllOnDemandMicros the
	// round entirely on demand with whole-hour billing per session;
	// SavingMicros their difference.
	TotalMicros, AllOnDemandMicros, SavingMicros int64
	Currency                                     string
}

// Advise plans the round. Training runs on spot in the cheapest whole hours
// before the deadline (on demand in any hour where spot is not cheaper),
// needing SpotOverheadPercent more GPU time on spot; tuning runs on demand,
// billed by the second. The baseline bills training on demand and rounds
// every tuning session up to whole hours, as an hourly cloud does.
func Advise(w Workload, m Market) (Advice, error) {
	if err := w.Validate(); err != nil {
		return Advice{}, err
	}
	if m.OnDemandMicros <= 0 {
		return Advice{}, errors.New("on-demand price must be positive")
	}
	adv := Advice{Currency: m.Currency}
	// Baseline: everything on demand, tuning in whole hours.
	hoursPerSession := int64((w.SessionLength + time.Hour - 1) / time.Hour)
	adv.AllOnDemandMicros = ledger.AmountMicros(m.OnDemandMicros, 1, 1000, w.TrainingGPUHours*3600) +
		ledger.AmountMicros(m.OnDemandMicros, w.SessionGPUs, 1000, w.TuningSessions*hoursPerSession*3600)

	// Training: fill the cheapest hours first.
	type slot struct {
		start time.Time
		price int64
		plan  shizuv1.Plan
	}
	var slots []slot
	for t := w.From.Truncate(time.Hour); t.Add(time.Hour).Compare(w.Deadline) <= 0; t = t.Add(time.Hour) {
		if t.Before(w.From) {
			continue
		}
		s := slot{start: t, price: m.SpotByHourMicros[t.UTC().Hour()], plan: shizuv1.Plan_PLAN_SPOT}
		if s.price >= m.OnDemandMicros {
			s.price, s.plan = m.OnDemandMicros, shizuv1.Plan_PLAN_ON_DEMAND
		}
		slots = append(slots, s)
	}
	sort.SliceStable(slots, func(i, j int) bool { return slots[i].price < slots[j].price })
	// Remaining work in GPU-seconds, scaled for spot overhead when on spot.
	need := w.TrainingGPUHours * 3600
	for _, s := range slots {
		if need <= 0 {
			break
		}
		capacity := int64(w.TrainingGPUs) * 3600
		work := capacity
		if s.plan == shizuv1.Plan_PLAN_SPOT {
			work = capacity * 100 / (100 + w.SpotOverheadPercent)
		}
		used := capacity
		if work > need {
			used = (need*capacity + work - 1) / work
			work = need
		}
		need -= work
		secs := (used + int64(w.TrainingGPUs) - 1) / int64(w.TrainingGPUs)
		micros := ledger.AmountMicros(s.price, w.TrainingGPUs, 1000, secs)
		adv.Blocks = append(adv.Blocks, Block{What: "training", Plan: s.plan, Start: s.start,
			End: s.start.Add(time.Duration(secs) * time.Second), GPUs: w.TrainingGPUs, Micros: micros})
		adv.TotalMicros += micros
	}
	if need > 0 {
		return Advice{}, fmt.Errorf("training does not fit before the deadline: %d GPU-hours short with %d GPUs", (need+3599)/3600, w.TrainingGPUs)
	}
	// Tuning: on demand, by the second.
	if w.TuningSessions > 0 {
		micros := ledger.AmountMicros(m.OnDemandMicros, w.SessionGPUs, 1000, w.TuningSessions*int64(w.SessionLength/time.Second))
		adv.Blocks = append(adv.Blocks, Block{What: "tuning", Plan: shizuv1.Plan_PLAN_ON_DEMAND, Start: w.From, End: w.Deadline,
			GPUs: w.SessionGPUs, Micros: micros})
		adv.TotalMicros += micros
	}
	sort.SliceStable(adv.Blocks, func(i, j int) bool { return adv.Blocks[i].Start.Before(adv.Blocks[j].Start) })
	adv.SavingMicros = adv.AllOnDemandMicros - adv.TotalMicros
	return adv, nil
}
