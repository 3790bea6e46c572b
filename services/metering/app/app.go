// Package app wires the metering service to the bus and Redis and runs it.
// Its decisions live in packages beside it that import neither NATS nor
// Redis.
package app

import (
	"context"
	"flag"

	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the metering's configuration.
type Config struct {
	Service service.Config
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{Service: service.Defaults(topology.Metering)}
}

// RegisterFlags binds the metering's own flags (the common ones are bound by
// service.Main).
func (c *Config) RegisterFlags(*flag.FlagSet) {}

// Validate reports every problem in the configuration.
func (c Config) Validate() error { return c.Service.Validate() }

// Run runs the metering until ctx ends: it connects with its own NATS user,
// ensures the durable consumers the topology declares for it, and reports
// ready on /readyz.
func Run(ctx context.Context, cfg Config) error {
	svc, _ := topology.ServiceNamed(topology.Metering)
	return service.Run(ctx, cfg.Service, service.DeclaredConsumers(svc.Consumers...))
}
