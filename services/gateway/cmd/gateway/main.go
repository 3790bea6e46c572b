// Command gateway runs Shizu's tenant API (services/gateway): HTTP/JSON
// under /v1, API keys, rate limits, idempotent POSTs and an audit log.
// Configuration comes from flags, which default to SHIZU_* environment
// variables; run with -h for the list and -validate to check a
// configuration without starting.
//
// One-shot commands (app.Commands), run with the gateway's NATS user:
//
//	gateway tenant create -id acme -name "Acme Corp"   record a tenant
//	gateway tenant ls                                  list the tenants
//	gateway key create -tenant acme -scope read-write  make a key (printed once)
//	gateway key create -scope operator                 make an operator key
//	gateway key ls [-tenant acme]                      list keys (never their secrets)
//	gateway key revoke -id 0123456789ab                revoke a key on every replica
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/shared/service"
)

func main() {
	if len(os.Args) > 1 && app.IsCommand(os.Args[1]) {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := app.Command(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	cfg := app.DefaultConfig()
	os.Exit(service.Main(os.Args[1:], os.Stderr, service.Binary{
		Config:   &cfg.Service,
		Flags:    cfg.RegisterFlags,
		Validate: func() error { return cfg.Validate() },
		Run:      func(ctx context.Context) error { return app.Run(ctx, cfg) },
	}))
}
