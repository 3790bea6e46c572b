package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/service"
)

// Commands are the one-shot operations of the metering binary, beside
// running the service: `metering rebuild`, `metering invoice` and
// `metering report`.
var Commands = map[string]string{
	"rebuild": "recompute the usage aggregates in Redis from the BILLING stream",
	"invoice": "close a tenant's invoice for a period and publish it",
	"report":  "print a tenant's spend in a month by label and the budget thresholds it crossed",
}

// Report is a tenant's month: spend by label key=value and currency, and
// the budget thresholds crossed.
type Report struct {
	Tenant        string           `json:"tenant"`
	Month         string           `json:"month"`
	ByLabel       map[string]int64 `json:"by_label_micros"`
	CrossedMicros []int64          `json:"budget_thresholds_crossed_micros"`
}

// Command runs one of Commands with its arguments until it is done or ctx
// ends, and returns the exit code: 0 done, 1 failed, 2 bad arguments or
// configuration.
func Command(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	if _, ok := Commands[name]; !ok {
		fmt.Fprintf(stderr, "metering: unknown command %q\n", name)
		return 2
	}
	a, ok := parseCommand(name, args, stderr)
	if !ok {
		return 2
	}
	if err := a.cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "metering: invalid configuration:\n%v\n", err)
		return 2
	}
	rt, err := service.Start(ctx, a.cfg.Service)
	if err != nil {
		fmt.Fprintf(stderr, "metering %s: %v\n", name, err)
		return 1
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.Service.ShutdownTimeout)
		defer cancel()
		_ = rt.Close(closeCtx)
	}()
	if rt.Redis == nil {
		fmt.Fprintln(stderr, "metering: -redis-url is required")
		return 2
	}
	store := redisstore.New(rt.Redis, a.cfg.KeyPrefix)
	var out any
	switch name {
	case "rebuild":
		out, err = Rebuild(ctx, rt.Bus, store)
	case "invoice":
		out, err = CloseInvoice(ctx, a.cfg, rt.Bus, store, a.tenant, a.from, a.to)
	case "report":
		out, err = MonthReport(ctx, store, a.tenant, a.month)
	}
	if err != nil {
		fmt.Fprintf(stderr, "metering %s: %v\n", name, err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	return 0
}

// commandArgs are a command's configuration and arguments.
type commandArgs struct {
	cfg             Config
	tenant          string
	from, to, month time.Time
}

// parseCommand parses a command's flags; false when they are bad (the
// problems are written to stderr).
func parseCommand(name string, args []string, stderr io.Writer) (commandArgs, bool) {
	a := commandArgs{cfg: DefaultConfig()}
	fs := flag.NewFlagSet("metering "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	a.cfg.Service.RegisterFlags(fs)
	a.cfg.RegisterFlags(fs)
	tenant := fs.String("tenant", "", "tenant to invoice (invoice)")
	from := fs.String("from", "", "first day of the period, YYYY-MM-DD (invoice)")
	to := fs.String("to", "", "day after the period, YYYY-MM-DD (invoice)")
	month := fs.String("month", "", "month to report, YYYY-MM (report)")
	if err := fs.Parse(args); err != nil {
		return a, false
	}
	a.cfg.Service.HTTPAddr = ""
	a.tenant = *tenant
	switch name {
	case "invoice":
		var errs []error
		var err error
		if *tenant == "" {
			errs = append(errs, fmt.Errorf("-tenant is required"))
		}
		if a.from, err = time.Parse(time.DateOnly, *from); err != nil {
			errs = append(errs, fmt.Errorf("-from: %w", err))
		}
		if a.to, err = time.Parse(time.DateOnly, *to); err != nil {
			errs = append(errs, fmt.Errorf("-to: %w", err))
		}
		for _, e := range errs {
			fmt.Fprintf(stderr, "metering invoice: %v\n", e)
		}
		return a, len(errs) == 0
	case "report":
		var err error
		if a.month, err = time.Parse("2006-01", *month); err != nil || *tenant == "" {
			fmt.Fprintf(stderr, "metering report: -tenant and -month YYYY-MM are required (%v)\n", err)
			return a, false
		}
	}
	return a, true
}

// MonthReport reads a tenant's cost report for the month of t.
func MonthReport(ctx context.Context, store *redisstore.Store, tenant string, t time.Time) (Report, error) {
	month := t.UTC().Format("2006-01")
	by, err := store.LabelReport(ctx, tenant, t)
	if err != nil {
		return Report{}, err
	}
	crossed, err := store.Alerts(ctx, tenant, month)
	if err != nil {
		return Report{}, err
	}
	return Report{Tenant: tenant, Month: month, ByLabel: by, CrossedMicros: crossed}, nil
}
