package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/shared/rent"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// spotPriceVerb publishes a spot price change, as a market feed would:
// nothing in the platform sets spot prices itself. Metering bills spot
// seconds at it; the scheduler places capped spot requests against it and
// interrupts running ones it puts above their maximum.
// spotPriceFields are the SpotPriceChanged fields `shizu spot-price` sets.
var spotPriceFields = fieldWords{"price_per_gpu_hour": "price", "effective_at": "-at"}

var spotPriceVerb = verb{
	name:    "spot-price",
	summary: "Publish a spot price change (SpotPriceChanged) of a GPU model in a zone, as a market feed would.",
	usage:   "<zone> <model> <price per GPU-hour> [flags]",
	examples: `  shizu spot-price local A100-PCIE-40GB 2.10          # in force now
  shizu spot-price local H100-SXM5-80GB 3.00 -currency EUR -at 2026-12-03T15:00:00Z
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		currency := fs.String("currency", "USD", "currency of the price")
		at := fs.String("at", "", "RFC 3339 time from when the price applies (default: now)")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			ev, subj, err := spotPriceChanged(args, *currency, *at, time.Now())
			if err != nil {
				return err
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			ack, err := conn.Publish(ctx, subj, ev)
			if err != nil {
				return fmt.Errorf("publish spot price: %w", err)
			}
			if ack.Duplicate {
				return fmt.Errorf("a price for %s in %s effective at %s was published already (the stream keeps the first; pick another -at)",
					ev.GetModel(), ev.GetZone(), ev.GetEffectiveAt().AsTime().Format(time.RFC3339))
			}
			if cf.output == "json" {
				return printJSON(stdout, map[string]any{"event_id": ev.GetMeta().GetEventId(), "zone": ev.GetZone(), "model": ev.GetModel(),
					"price_per_gpu_hour_micros": ev.GetPricePerGpuHour().GetMicros(), "currency": ev.GetPricePerGpuHour().GetCurrency()})
			}
			fmt.Fprintf(stdout, "spot price of %s in %s: %s %s per GPU-hour from %s\n", ev.GetModel(), ev.GetZone(), args[2],
				ev.GetPricePerGpuHour().GetCurrency(), ev.GetEffectiveAt().AsTime().Format(time.RFC3339))
			return nil
		}
	},
}

// spotPriceChanged builds and validates the event of `shizu spot-price`
// and its subject. The event id is the one the proto names
// ("spot:<zone>:<model>:<effective_at>"), so the same change sent twice
// is stored once.
func spotPriceChanged(args []string, currency, at string, now time.Time) (*shizuv1.SpotPriceChanged, string, error) {
	if len(args) != 3 {
		return nil, "", usagef("want <zone> <model> <price>")
	}
	zone, model := args[0], args[1]
	micros, err := rent.ParseMicros(args[2])
	if err != nil {
		return nil, "", usagef("price: %w", err)
	}
	subj, err := subject.Format(subject.SpotPriceChanged, zone, model)
	if err != nil {
		return nil, "", usagef("zone or model: %w", err)
	}
	// What metering would refuse to bill by is refused here, with the reason.
	cat, err := pricing.Shipped()
	if err != nil {
		return nil, "", err
	}
	if _, err := cat.Type(model); err != nil {
		return nil, "", usagef("model %q is not in the price catalogue; models: %s", model, strings.Join(cat.Models(), ", "))
	}
	if currency != cat.Currency {
		return nil, "", usagef("-currency %s: the catalogue prices in %s", currency, cat.Currency)
	}
	if micros > pricing.MaxPriceMicros {
		return nil, "", usagef("price %s is above the most a GPU-hour may cost (%d)", args[2], int64(pricing.MaxPriceMicros/rent.MicrosPerUnit))
	}
	effective := now.UTC().Truncate(time.Second)
	if at != "" {
		if effective, err = time.Parse(time.RFC3339, at); err != nil {
			return nil, "", usagef("-at: %w", err)
		}
		effective = effective.UTC().Truncate(time.Second) // as its event id names it
	}
	ev := &shizuv1.SpotPriceChanged{
		Meta:  shizuv1.NewMeta(fmt.Sprintf("spot:%s:%s:%s", zone, model, effective.UTC().Format(time.RFC3339)), cliSource, "", zone, now),
		Model: model, Zone: zone, PricePerGpuHour: &shizuv1.Money{Micros: micros, Currency: currency},
		EffectiveAt: timestamppb.New(effective),
	}
	if err := ev.Validate(); err != nil {
		return nil, "", invalid(err, spotPriceFields)
	}
	return ev, subj, nil
}
