package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/advisor"
	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// spotHistory turns stored spot price changes of one model (any zone, or
// the given one) into the advisor's price points.
func spotHistory(events []event, model, zone, currency string) []ledger.PricePoint {
	var out []ledger.PricePoint
	for _, e := range events {
		m, ok := e.Msg.(*shizuv1.SpotPriceChanged)
		if !ok || m.GetModel() != model || (zone != "" && m.GetZone() != zone) || m.GetPricePerGpuHour().GetCurrency() != currency {
			continue
		}
		at := ts(m.GetEffectiveAt())
		if at.IsZero() {
			at = ts(m.GetMeta().GetOccurredAt())
		}
		out = append(out, ledger.PricePoint{At: at, Price: pricing.FromProto(m.GetPricePerGpuHour())})
	}
	return out
}

var adviseVerb = verb{
	name:    "advise",
	summary: "The cost advisor: the cheapest plan mix and schedule for a development round (training on spot in the cheapest hours, tuning on demand by the second) and the saving against all on-demand.",
	usage:   "[flags]",
	examples: `  shizu advise -training-gpu-hours 400 -training-gpus 8 -sessions 20 -session-length 45m
  shizu advise -model A100-SXM4-80GB -days 3 -spot-price 0.90 -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		model := fs.String("model", "H100-SXM5-80GB", "GPU model (prices from the catalogue)")
		zone := fs.String("zone", "", "zone whose spot prices to use (default any)")
		trainHours := fs.Int64("training-gpu-hours", 200, "GPU-hours of checkpointed, interruptible training")
		trainGPUs := fs.Int("training-gpus", 8, "GPUs the training runs on in parallel")
		overhead := fs.Int64("spot-overhead", 10, "percent more GPU time training needs on spot (work redone after interruptions)")
		sessions := fs.Int64("sessions", 10, "interactive tuning sessions")
		sessionLen := fs.Duration("session-length", 40*time.Minute, "length of one tuning session")
		sessionGPUs := fs.Int("session-gpus", 1, "GPUs per tuning session")
		days := fs.Int("days", 7, "the round runs from the next whole hour for this many days")
		lookback := fs.Duration("lookback", 7*24*time.Hour, "spot price history to average by hour of day")
		spot := fs.String("spot-price", "", "assume this flat spot price per GPU-hour where no spot prices were published")
		offline := fs.Bool("offline", false, "do not read spot prices from the platform (use -spot-price or list prices)")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			cat, err := pricing.Shipped()
			if err != nil {
				return err
			}
			onDemand, err := cat.OnDemand(*model)
			if err != nil {
				return usagef("-model %q is not in the price catalogue; models: %s", *model, strings.Join(cat.Models(), ", "))
			}
			if *days < 1 || *days > 366 {
				return usagef("-days %d: want 1..366", *days)
			}
			now := time.Now().UTC()
			from := now.Truncate(time.Hour).Add(time.Hour)
			w := advisor.Workload{TrainingGPUHours: *trainHours, TrainingGPUs: int32(*trainGPUs), SpotOverheadPercent: *overhead,
				TuningSessions: *sessions, SessionLength: *sessionLen, SessionGPUs: int32(*sessionGPUs),
				From: from, Deadline: from.Add(time.Duration(*days) * 24 * time.Hour)}
			if err := adviseFlagsProblem(w); err != nil {
				return err
			}
			if err := w.Validate(); err != nil {
				return usagef("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			m, source, err := adviceMarket(ctx, cf, onDemand, *model, *zone, *spot, *lookback, *offline, now)
			if err != nil {
				return err
			}
			adv, err := advisor.Advise(w, m)
			if err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, adviceJSON(*model, onDemand, source, adv))
			}
			return printAdvice(stdout, *model, onDemand, source, adv)
		}
	},
}

// adviseFlagsProblem names the flag of a workload the advisor would
// refuse ("quantities must not be negative" does not say which).
func adviseFlagsProblem(w advisor.Workload) error {
	for _, f := range []struct {
		flag string
		bad  bool
		v    any
	}{
		{"-training-gpu-hours", w.TrainingGPUHours < 0, w.TrainingGPUHours},
		{"-spot-overhead", w.SpotOverheadPercent < 0, w.SpotOverheadPercent},
		{"-sessions", w.TuningSessions < 0, w.TuningSessions},
		{"-session-length", w.SessionLength < 0, w.SessionLength},
	} {
		if f.bad {
			return usagef("%s %v: must not be negative", f.flag, f.v)
		}
	}
	switch {
	case w.TrainingGPUHours > 0 && w.TrainingGPUs < 1:
		return usagef("-training-gpus %d: training needs at least one GPU (or -training-gpu-hours 0)", w.TrainingGPUs)
	case w.TuningSessions > 0 && w.SessionGPUs < 1:
		return usagef("-session-gpus %d: tuning sessions need at least one GPU (or -sessions 0)", w.SessionGPUs)
	case w.TuningSessions > 0 && w.SessionLength <= 0:
		return usagef("-session-length %s: tuning sessions need a length (or -sessions 0)", w.SessionLength)
	}
	return nil
}

// adviceMarket is the market the advice prices: the on-demand list price,
// and spot by hour of day from the platform's spot price history over
// lookback (not read when offline), else the flat -spot-price, else the
// list price. source says which, for the report.
func adviceMarket(ctx context.Context, cf clientFlags, onDemand pricing.Money, model, zone, spot string, lookback time.Duration,
	offline bool, now time.Time) (advisor.Market, string, error) {
	m := advisor.Market{Currency: onDemand.Currency, OnDemandMicros: onDemand.Micros}
	var history []ledger.PricePoint
	source := "list price (no spot prices known)"
	if !offline {
		conn, _, err := cf.connect(ctx)
		if err != nil {
			return m, "", err
		}
		evs, err := readStream(ctx, conn, topology.StreamMarket, subject.SpotPriceChangedAll)
		_ = conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return m, "", err
		}
		history = spotHistory(evs, model, zone, onDemand.Currency)
		if len(history) > 0 {
			source = fmt.Sprintf("%d spot price changes over the last %s", len(history), lookback)
		}
	}
	flat := onDemand.Micros
	switch {
	case len(history) > 0:
		m.SpotByHourMicros = advisor.SpotByHour(history, onDemand.Micros, now.Add(-lookback), now)
		return m, source, nil
	case spot != "":
		micros, err := rent.ParseMicros(spot)
		if err != nil {
			return m, "", usagef("-spot-price: %w (e.g. -spot-price 1.20)", err)
		}
		flat, source = micros, "assumed flat spot price "+money(micros, onDemand.Currency)
	}
	for h := range m.SpotByHourMicros {
		m.SpotByHourMicros[h] = flat
	}
	return m, source, nil
}

// adviceView is what `shizu advise -o json` prints.
type adviceView struct {
	Model          string      `json:"model"`
	Prices         string      `json:"prices"`
	OnDemandMicros int64       `json:"on_demand_micros"`
	Currency       string      `json:"currency"`
	Advice         adviceTotal `json:"advice"`
}

// adviceTotal is the recommended schedule and its cost against all on
// demand.
type adviceTotal struct {
	Blocks            []adviceBlock `json:"blocks"`
	TotalMicros       int64         `json:"total_micros"`
	AllOnDemandMicros int64         `json:"all_on_demand_micros"`
	SavingMicros      int64         `json:"saving_micros"`
	Currency          string        `json:"currency"`
}

// adviceBlock is one block of the schedule: what runs, on which plan,
// when, on how many GPUs, at what cost.
type adviceBlock struct {
	What   string    `json:"what"`
	Plan   string    `json:"plan"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	GPUs   int32     `json:"gpus"`
	Micros int64     `json:"cost_micros"`
}

func adviceJSON(model string, onDemand pricing.Money, source string, adv advisor.Advice) adviceView {
	v := adviceView{Model: model, Prices: source, OnDemandMicros: onDemand.Micros, Currency: onDemand.Currency,
		Advice: adviceTotal{Blocks: []adviceBlock{}, TotalMicros: adv.TotalMicros, AllOnDemandMicros: adv.AllOnDemandMicros,
			SavingMicros: adv.SavingMicros, Currency: adv.Currency}}
	for _, b := range adv.Blocks {
		v.Advice.Blocks = append(v.Advice.Blocks, adviceBlock{What: b.What, Plan: planName(b.Plan), Start: b.Start.UTC(), End: b.End.UTC(),
			GPUs: b.GPUs, Micros: b.Micros})
	}
	return v
}

// printAdvice writes the advice as a table of blocks and the saving.
func printAdvice(stdout io.Writer, model string, onDemand pricing.Money, source string, adv advisor.Advice) error {
	fmt.Fprintf(stdout, "%s at %s per GPU-hour on demand; spot from %s\n\n", model, money(onDemand.Micros, onDemand.Currency), source)
	tw := table(stdout)
	fmt.Fprintln(tw, "WHAT\tPLAN\tSTART (UTC)\tEND (UTC)\tGPUS\tCOST")
	for _, b := range adv.Blocks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", b.What, planName(b.Plan), b.Start.UTC().Format("Mon 15:04"), b.End.UTC().Format("Mon 15:04"), b.GPUs, money(b.Micros, adv.Currency))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nrecommended: %s\nall on demand, hourly billing: %s\nsaving: %s\n",
		money(adv.TotalMicros, adv.Currency), money(adv.AllOnDemandMicros, adv.Currency), money(adv.SavingMicros, adv.Currency))
	return nil
}
