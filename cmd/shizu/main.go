// Command shizu is Shizu's command line: `shizu dev` runs the whole
// platform on this machine, `shizu provision` creates the JetStream streams
// of a deployed platform.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
)

const usage = `shizu: the Shizu GPU rental control plane

Usage:
  shizu dev [flags]        run NATS, Redis and all five services on this machine
  shizu provision [flags]  create or update the JetStream streams (as the admin user)
  shizu replay [flags]     replay the Alibaba GPU trace through the placement policies
  shizu bench [flags]      measure the performance checks against ceilings of this machine
  shizu version            print the release and the commit it was built from

Tenant:
  shizu rent [flags]       rent GPUs (whole, fraction, NVLink, MIG, TEE; on-demand, reserved, spot)
  shizu ls                 list your rentals and their state
  shizu show <rental>      a rental's timeline: requested, scheduled, started, migrated, stopped
  shizu stop <rental>      stop a rental
  shizu bill               current charges and invoices
  shizu advise [flags]     the cost advisor: cheapest plan mix for a development round

Operator:
  shizu nodes              the fleet: capacity, allocation and health per GPU
  shizu pools              autoscaled pools and their last decisions
  shizu traffic <pool>     publish traffic samples to drive the autoscaler
  shizu chaos <action>     break a simulated node of shizu dev (kill, xid, ecc, interrupt, ...)

Run "shizu <command> -h" for a command's flags and examples.
`

// commandHint names the command closest to a mistyped one ("; did you
// mean rent?"), or "" when none is close.
func commandHint(name string) string {
	names := []string{"dev", "provision", "replay", "bench", "version", "help"}
	for n := range verbs() {
		names = append(names, n)
	}
	slices.Sort(names)
	if best := closest(name, names); best != "" {
		return "; did you mean " + best + "?"
	}
	return ""
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code: 0 ok, 1 the
// command failed, 2 the command line is wrong.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "dev":
		return devCommand(ctx, args[1:], stdout, stderr)
	case "provision":
		return provisionCommand(ctx, args[1:], stdout, stderr)
	case "replay":
		return replayCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		return versionCommand(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		if v, ok := verbs()[args[0]]; ok {
			return v.main(ctx, args[1:], stdout, stderr)
		}
		fmt.Fprintf(stderr, "shizu: unknown command %q%s (see 'shizu help')\n", args[0], commandHint(args[0]))
		return 2
	}
}
