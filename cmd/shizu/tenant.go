package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// The tenant's verbs that read and end rentals: ls, show and stop.

func tenantFlag(fs *flag.FlagSet) *string {
	return fs.String("tenant", envOr("SHIZU_TENANT", "dev"), "tenant id [SHIZU_TENANT]")
}

func rentalIDOf(m any) string {
	if g, ok := m.(interface{ GetRentalId() string }); ok {
		return g.GetRentalId()
	}
	return ""
}

// loadRentals reads the rental events of one tenant, or of all when tenant
// is empty.
func loadRentals(ctx context.Context, conn *bus.Conn, tenant string) ([]*rentalView, error) {
	filter := subject.RentalAll
	if tenant != "" {
		var err error
		if filter, err = subject.Format("rental.%s.>", tenant); err != nil {
			return nil, usagef("-tenant: %w", err)
		}
	}
	evs, err := readStream(ctx, conn, topology.StreamRentals, filter)
	if err != nil {
		return nil, err
	}
	return rentals(evs), nil
}

var lsVerb = verb{
	name:    "ls",
	summary: "List a tenant's rentals and their state, from the RENTALS stream.",
	usage:   "[flags]",
	examples: `  shizu ls
  shizu ls -all-tenants -active
  shizu ls -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := tenantFlag(fs)
		all := fs.Bool("all-tenants", false, "list every tenant's rentals")
		active := fs.Bool("active", false, "hide stopped and rejected rentals")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (did you mean shizu show %s?)", args[0], args[0])
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			t := *tenant
			if *all {
				t = ""
			}
			rs, err := loadRentals(ctx, conn, t)
			if err != nil {
				return err
			}
			out := []*rentalView{}
			for _, r := range rs {
				if *active && (r.State == stateStopped || r.State == stateRejected) {
					continue
				}
				out = append(out, r)
			}
			if cf.output == "json" {
				for _, r := range out {
					r.Timeline = nil
				}
				return printJSON(stdout, out)
			}
			tw := table(stdout)
			fmt.Fprintln(tw, "RENTAL\tTENANT\tSTATE\tNODE\tGPUS\tSHAPE\tPLAN\tMODEL\tSINCE\tWHY")
			for _, r := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Tenant, r.State, dash(r.Node), dash(joinInts(r.GPUs)), r.Shape, r.Plan,
					dash(r.Model), r.Since.Local().Format("15:04:05"), r.Why)
			}
			if len(out) == 0 {
				fmt.Fprintf(tw, "(no rentals for tenant %s: start one with `shizu rent`)\n", *tenant)
			}
			return tw.Flush()
		}
	},
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

var showVerb = verb{
	name:    "show",
	summary: "Show a rental and its event timeline: requested, scheduled where, started, migrated, stopped.",
	usage:   "<rental> [flags]",
	examples: `  shizu show r-3f9a2c1b7e
  shizu show r-3f9a2c1b7e -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one rental id (see shizu ls)")
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			r, err := findRental(ctx, conn, args[0])
			if err != nil {
				return err
			}
			if cf.output == "json" {
				return printJSON(stdout, r)
			}
			fmt.Fprintf(stdout, "rental %s (tenant %s): %s", r.ID, r.Tenant, r.State)
			if r.Why != "" {
				fmt.Fprintf(stdout, " (%s)", r.Why)
			}
			fmt.Fprintf(stdout, "\n  %s, %s", r.Shape, r.Plan)
			if r.Node != "" {
				fmt.Fprintf(stdout, "; on %s GPU %s (%s), attempt %d", r.Node, joinInts(r.GPUs), r.Model, r.Attempt)
			}
			fmt.Fprintln(stdout)
			fmt.Fprintln(stdout)
			tw := table(stdout)
			fmt.Fprintln(tw, "TIME\tEVENT\tDETAIL")
			for _, s := range r.Timeline {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.At.Local().Format("15:04:05.000"), s.Event, s.Detail)
			}
			return tw.Flush()
		}
	},
}

func findRental(ctx context.Context, conn *bus.Conn, id string) (*rentalView, error) {
	if err := shizuv1.ValidToken(id); err != nil {
		return nil, usagef("rental id: %w", err)
	}
	rs, err := loadRentals(ctx, conn, "")
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("no rental %s (list them with shizu ls)", id)
}

var stopVerb = verb{
	name:    "stop",
	summary: "Stop a rental: publish RentalCancelRequested and wait briefly for it to end.",
	usage:   "<rental> [flags]",
	examples: `  shizu stop r-3f9a2c1b7e
  shizu stop r-3f9a2c1b7e -reason "done tuning" -wait 0
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		reason := fs.String("reason", "", "free-text reason, kept for audit")
		by := fs.String("by", envOr("USER", "cli"), "who asks, for audit [USER]")
		wait := fs.Duration("wait", 20*time.Second, "how long to wait for the rental to stop (0: do not wait)")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one rental id (see shizu ls)")
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			r, err := findRental(ctx, conn, args[0])
			if err != nil {
				return err
			}
			if r.State == stateStopped || r.State == stateRejected {
				if cf.output == "json" {
					return printJSON(stdout, r)
				}
				fmt.Fprintf(stdout, "%s is already %s (%s)\n", r.ID, r.State, r.Why)
				return nil
			}
			who := *by
			if who == "" || shizuv1.ValidToken(who) != nil {
				who = "cli"
			}
			ev := &shizuv1.RentalCancelRequested{Meta: shizuv1.NewMeta("rental:"+r.ID+":cancel_requested", cliSource, "", r.ID, time.Now()),
				RentalId: r.ID, TenantId: r.Tenant, RequestedBy: who, Reason: *reason}
			if err := ev.Validate(); err != nil {
				return invalid(err, rentFields)
			}
			subj, err := subject.Format(subject.RentalCancelRequested, r.Tenant)
			if err != nil {
				return err
			}
			ack, err := conn.Publish(ctx, subj, ev)
			if err != nil {
				return fmt.Errorf("publish the cancel request: %w", err)
			}
			if *wait > 0 {
				if r, err = follow(ctx, conn, r.Tenant, r.ID, ack.Sequence, *wait, func(r *rentalView) bool {
					return r.State == stateStopped || r.State == stateRejected
				}); err != nil {
					return err
				}
			}
			if cf.output == "json" {
				return printJSON(stdout, r)
			}
			if r.State == stateStopped || r.State == stateRejected {
				fmt.Fprintf(stdout, "%s %s (%s)\n", r.ID, r.State, r.Why)
			} else {
				fmt.Fprintf(stdout, "%s: cancel requested; still %s. Follow it with: shizu show %s\n", r.ID, r.State, r.ID)
			}
			return nil
		}
	},
}
