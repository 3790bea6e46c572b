package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rentallogs"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

var logsVerb = verb{
	name:    "logs",
	summary: "Print a rental's output (what its workload writes to stdout and stderr), the last lines or as it comes.",
	usage:   "<rental> [-f] [-n N] [flags]",
	examples: `  shizu logs r-3f9a2c1b7e
  shizu logs -n 20 -f r-3f9a2c1b7e
  shizu logs r-3f9a2c1b7e -o json
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		var cf clientFlags
		cf.register(fs)
		tenant := tenantFlag(fs)
		follow := fs.Bool("f", false, "follow: keep printing new lines until interrupted (Ctrl-C)")
		n := fs.Int("n", 100, fmt.Sprintf("how many of the last lines to print first, 0..%d (0 with -f: only new lines)", rentallogs.MaxTail))
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return usagef("want one rental id (see shizu ls)")
			}
			rental := args[0]
			if err := subject.Token(rental); err != nil {
				return usagef("rental id: %w", err)
			}
			if err := subject.Token(*tenant); err != nil {
				return usagef("-tenant: %w", err)
			}
			if *n < 0 || *n > rentallogs.MaxTail || (*n == 0 && !*follow) {
				return usagef("-n %d: want 1..%d (or 0 with -f)", *n, rentallogs.MaxTail)
			}
			conn, _, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			emit := linePrinter(stdout, cf.output == "json")
			js := conn.JetStream()
			var from uint64
			if *n > 0 {
				lines, cursor, err := rentallogs.Tail(ctx, js, *tenant, rental, *n)
				if err != nil {
					return logsError(err)
				}
				if len(lines) == 0 && !*follow {
					return fmt.Errorf("rental %s of tenant %s has no output in its log (yet); a rental that has not started has none, and another tenant's rental needs -tenant", rental, *tenant)
				}
				for _, l := range lines {
					if err := emit(l); err != nil {
						return err
					}
				}
				from = cursor
			}
			if !*follow {
				return nil
			}
			return logsError(rentallogs.Follow(ctx, js, *tenant, rental, from, emit))
		}
	},
}

// logLine is one entry of a rental's output as -o json prints it, one
// object a line.
type logLine struct {
	Seq       uint64     `json:"seq"`
	Attempt   int32      `json:"attempt"`
	NodeID    string     `json:"node_id"`
	At        *time.Time `json:"at,omitempty"`
	Text      string     `json:"text"`
	Truncated bool       `json:"truncated,omitempty"`
	Dropped   int64      `json:"dropped,omitempty"`
	End       bool       `json:"end,omitempty"`
}

// linePrinter prints entries as text (markers in words) or as JSON lines.
func linePrinter(w io.Writer, asJSON bool) func(rentallogs.Line) error {
	enc := json.NewEncoder(w)
	return func(l rentallogs.Line) error {
		if !asJSON {
			_, err := fmt.Fprintln(w, l.String())
			return err
		}
		out := logLine{Seq: l.Seq, Attempt: l.Attempt, NodeID: l.NodeID, Text: l.Text, Truncated: l.Truncated, Dropped: l.Dropped, End: l.End}
		if !l.At.IsZero() {
			at := l.At
			out.At = &at
		}
		return enc.Encode(out)
	}
}

// logsError makes bad input a usage error (exit 2) and a platform without
// the LOGS stream a hint.
func logsError(err error) error {
	switch {
	case fault.IsInvalid(err):
		return usagef("%w", err)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("stream %s does not exist: run `shizu provision` (shizu dev does it)", topology.StreamLogs)
	}
	return err
}
