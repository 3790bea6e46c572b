// Command metering runs the Shizu metering service. Configuration comes from flags,
// which default to SHIZU_* environment variables; run with -h for the list
// and -validate to check a configuration without starting.
//
// One-shot commands (app.Commands):
//
//	metering rebuild                                              recompute the aggregates from the BILLING stream
//	metering invoice -tenant T -from 2026-11-01 -to 2026-12-01    close and publish a tenant's invoice for a period
//	metering report -tenant T -month 2026-11                      print a tenant's spend by label and the budget thresholds crossed
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shizu-gpu/shizu/services/metering/app"
	"github.com/shizu-gpu/shizu/shared/service"
)

func main() {
	if len(os.Args) > 1 {
		if _, ok := app.Commands[os.Args[1]]; ok {
			os.Exit(command(os.Args[1], os.Args[2:]))
		}
	}
	cfg := app.DefaultConfig()
	os.Exit(service.Main(os.Args[1:], os.Stderr, service.Binary{
		Config:   &cfg.Service,
		Flags:    cfg.RegisterFlags,
		Validate: func() error { return cfg.Validate() },
		Run:      func(ctx context.Context) error { return app.Run(ctx, cfg) },
	}))
}

// command runs a one-shot command until it is done or interrupted.
func command(name string, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return app.Command(ctx, name, args, os.Stdout, os.Stderr)
}
