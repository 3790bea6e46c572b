// Command scheduler runs the Shizu scheduler service. Configuration comes from flags,
// which default to SHIZU_* environment variables; run with -h for the list
// and -validate to check a configuration without starting.
package main

import (
	"context"
	"os"

	"github.com/shizu-gpu/shizu/services/scheduler/app"
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
