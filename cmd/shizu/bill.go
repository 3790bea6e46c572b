package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var billVerb = verb{
	name:    "bill",
	summary: "Show a tenant's current charges (usage records from the BILLING stream) and closed invoices.",
	usage:   "[flags]",
	examples: `  shizu bill
  shizu bill -tenant acme -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := tenantFlag(fs)
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			usage, err := subject.Format(subject.UsageRecorded, *tenant)
			if err != nil {
				return usagef("-tenant: %w", err)
			}
			invoices, _ := subject.Format(subject.InvoiceClosed, *tenant)
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			evs, err := readStream(ctx, conn, topology.StreamBilling, usage, invoices)
			if err != nil {
				return err
			}
			v := bill(*tenant, evs)
			if cf.output == "json" {
				return printJSON(stdout, v)
			}
			tw := table(stdout)
			fmt.Fprintln(tw, "RENTAL\tPLAN\tMODEL\tSECONDS\tRECORDS\tBILLED THROUGH\tAMOUNT")
			for _, c := range v.Charges {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", c.Rental, c.Plan, c.modelColumn(), c.Seconds, c.Records, c.Through, money(c.Micros, c.Currency))
			}
			cur := v.Currency
			if cur == "" {
				cur = "USD"
			}
			fmt.Fprintf(tw, "TOTAL\t\t\t\t\t\t%s\n", money(v.Total, cur))
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "\nRunning rentals are billed per second in records closed at each metering interval (and at once when they stop).")
			if len(v.Invoices) > 0 {
				fmt.Fprintln(stdout)
				tw = table(stdout)
				fmt.Fprintln(tw, "INVOICE\tFROM\tTO\tTOTAL")
				for _, in := range v.Invoices {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", in.ID, in.From.Format("2006-01-02"), in.To.Format("2006-01-02"), money(in.Micros, in.Currency))
				}
				return tw.Flush()
			}
			return nil
		}
	},
}
