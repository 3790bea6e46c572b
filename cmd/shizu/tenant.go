package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// The tenant's verbs that read and end rentals: ls, show and stop, each
// a call of the gateway with the tenant's API key.

func tenantFlag(fs *flag.FlagSet) *string {
	return fs.String("tenant", envOr("SHIZU_TENANT", "dev"), "tenant id [SHIZU_TENANT]")
}

// listRentals reads every page of the key's tenant's rentals.
func listRentals(ctx context.Context, api *apiClient) ([]*rentalView, error) {
	var out []*rentalView
	cursor := ""
	for {
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Rentals    []*rentalView `json:"rentals"`
			NextCursor string        `json:"next_cursor"`
		}
		if err := api.do(ctx, request{method: http.MethodGet, path: "/v1/rentals?" + q.Encode()}, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Rentals...)
		if page.NextCursor == "" || len(page.Rentals) == 0 {
			return out, nil
		}
		cursor = page.NextCursor
	}
}

var lsVerb = verb{
	name:    "ls",
	summary: "List your rentals and their state (the tenant of your API key).",
	usage:   "[flags]",
	examples: `  shizu ls
  shizu ls -active
  shizu ls -w              # then a line for each change, until Ctrl-C
  shizu ls -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var af apiFlags
		af.register(fs)
		tenant := fs.String("tenant", "", "no longer taken: the tenant is the one your API key acts for")
		all := fs.Bool("all-tenants", false, "no longer taken: a tenant key lists only its tenant's rentals")
		active := fs.Bool("active", false, "hide stopped and rejected rentals")
		watch := fs.Bool("w", false, "after the list, print a line for each rental that changes, until Ctrl-C")
		every := fs.Duration("every", 2*time.Second, "with -w: how often to look for changes")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			switch {
			case len(args) > 0:
				return usagef("unexpected argument %q (did you mean shizu show %s?)", args[0], args[0])
			case *tenant != "":
				return usagef("-tenant %s: the tenant is the one your API key acts for; use a key of that tenant (shizu login)", *tenant)
			case *all:
				return usagef("-all-tenants: a tenant key lists only its own tenant's rentals")
			case *every <= 0:
				return usagef("-every %s: want a positive duration", *every)
			}
			api, err := af.client()
			if err != nil {
				return err
			}
			ls := lsCommand{api: api, active: *active, json: af.output == "json"}
			seen, err := ls.once(ctx, stdout)
			if err != nil || !*watch {
				return err
			}
			return ls.watch(ctx, stdout, seen, *every)
		}
	},
}

// lsCommand is one `shizu ls`.
type lsCommand struct {
	api    *apiClient
	active bool
	json   bool
}

func (c lsCommand) list(ctx context.Context) ([]*rentalView, error) {
	rs, err := listRentals(ctx, c.api)
	if err != nil {
		return nil, err
	}
	out := []*rentalView{}
	for _, r := range rs {
		if c.active && (r.State == stateStopped || r.State == stateRejected) {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// once prints the list; it returns each rental's line, to tell changes.
func (c lsCommand) once(ctx context.Context, stdout io.Writer) (map[string]string, error) {
	out, err := c.list(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]string{}
	for _, r := range out {
		seen[r.ID] = lsRow(r)
	}
	if c.json {
		for _, r := range out {
			r.Timeline = nil
		}
		return seen, printJSON(stdout, out)
	}
	tw := table(stdout)
	fmt.Fprintln(tw, "RENTAL\tTENANT\tSTATE\tNODE\tGPUS\tSHAPE\tPLAN\tMODEL\tSINCE\tWHY")
	for _, r := range out {
		fmt.Fprintln(tw, lsRow(r))
	}
	if len(out) == 0 {
		fmt.Fprintln(tw, "(no rentals: start one with `shizu rent`)")
	}
	return seen, tw.Flush()
}

func lsRow(r *rentalView) string {
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.ID, r.Tenant, r.State, dash(r.Node), dash(joinInts(r.GPUs)), r.Shape, r.Plan,
		dash(r.Model), r.Since.Local().Format("15:04:05"), r.Why)
}

// watch lists again every interval and prints the rows that changed (as
// JSON lines with -o json) until ctx ends or Ctrl-C.
func (c lsCommand) watch(ctx context.Context, stdout io.Writer, seen map[string]string, every time.Duration) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		out, err := c.list(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		tw := table(stdout)
		for _, r := range out {
			row := lsRow(r)
			if seen[r.ID] == row {
				continue
			}
			seen[r.ID] = row
			if c.json {
				r.Timeline = nil
				if err := printJSON(stdout, r); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintln(tw, row)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
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
		var af apiFlags
		af.register(fs)
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one rental id (see shizu ls)")
			}
			api, err := af.client()
			if err != nil {
				return err
			}
			r, err := getRental(ctx, api, args[0])
			if err != nil {
				return err
			}
			if af.output == "json" {
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

func getRental(ctx context.Context, api *apiClient, id string) (*rentalView, error) {
	if err := shizuv1.ValidToken(id); err != nil {
		return nil, usagef("rental id: %w", err)
	}
	r := &rentalView{}
	if err := api.do(ctx, request{method: http.MethodGet, path: "/v1/rentals/" + url.PathEscape(id)}, r); err != nil {
		return nil, err
	}
	return r, nil
}

func ended(r *rentalView) bool { return r.State == stateStopped || r.State == stateRejected }

var stopVerb = verb{
	name:    "stop",
	summary: "Stop a rental: ask the gateway to stop it and wait briefly for it to end.",
	usage:   "<rental> [flags]",
	examples: `  shizu stop r-3f9a2c1b7e
  shizu stop r-3f9a2c1b7e -reason "done tuning" -wait 0
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var af apiFlags
		af.register(fs)
		reason := fs.String("reason", "", "free-text reason, kept for audit")
		by := fs.String("by", "", "no longer taken: the audit log records the API key that asks")
		wait := fs.Duration("wait", 20*time.Second, "how long to wait for the rental to stop (0: do not wait)")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			switch {
			case len(args) != 1:
				return usagef("want one rental id (see shizu ls)")
			case *by != "":
				return usagef("-by %s: the audit log records the API key that asks, not a name", *by)
			case len(*reason) > 256:
				return usagef("-reason: %d bytes; at most 256", len(*reason))
			}
			if err := shizuv1.ValidToken(args[0]); err != nil {
				return usagef("rental id: %w", err)
			}
			api, err := af.client()
			if err != nil {
				return err
			}
			r, err := getRental(ctx, api, args[0])
			if err != nil {
				return err
			}
			if ended(r) {
				if af.output == "json" {
					return printJSON(stdout, r)
				}
				fmt.Fprintf(stdout, "%s is already %s (%s)\n", r.ID, r.State, r.Why)
				return nil
			}
			var body any = struct{}{}
			if strings.TrimSpace(*reason) != "" {
				body = map[string]string{"reason": *reason}
			}
			if err := api.do(ctx, request{method: http.MethodPost, path: "/v1/rentals/" + url.PathEscape(r.ID) + "/stop", body: body,
				header: http.Header{"Idempotency-Key": {newIdempotencyKey()}}}, r); err != nil {
				return err
			}
			if *wait > 0 {
				if r, err = followUntil(ctx, api, r, *wait, ended); err != nil {
					return err
				}
			}
			if af.output == "json" {
				return printJSON(stdout, r)
			}
			if ended(r) {
				fmt.Fprintf(stdout, "%s %s (%s)\n", r.ID, r.State, r.Why)
			} else {
				fmt.Fprintf(stdout, "%s: stop requested; still %s. Follow it with: shizu show %s\n", r.ID, r.State, r.ID)
			}
			return nil
		}
	},
}
