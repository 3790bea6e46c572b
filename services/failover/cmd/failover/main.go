// Command failover runs the Shizu failover service. Configuration comes from
// flags, each defaulting to a SHIZU_* environment variable (failover's own
// are SHIZU_FAILOVER_<FLAG>; see app.Config.RegisterFlags). Run with -h for
// the list and -validate to check a configuration without starting.
package main

import (
	"context"
	"os"

	"github.com/shizu-gpu/shizu/services/failover/app"
	"github.com/shizu-gpu/shizu/shared/service"
)

func main() {
	cfg := app.DefaultConfig()
	os.Exit(service.Main(os.Args[1:], os.Stderr, service.Binary{
		Config:   &cfg.Service,
		Flags:    cfg.RegisterFlags,
		Validate: func() error { return cfg.Validate() },
		Run:      func(ctx context.Context) error { return app.Run(ctx, cfg) },
	}))
}
