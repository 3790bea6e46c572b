// Package app wires the node agent to the bus and Redis and runs it.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the node agent's configuration.
type Config struct {
	Service service.Config
	// NodeID names this GPU host on the bus; it defaults to the hostname.
	NodeID string
	// Simulate names a simulated GPU profile (e.g. h100x8) for hosts
	// without GPUs; empty means real NVML discovery.
	Simulate string
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{Service: service.Defaults(topology.NodeAgent), NodeID: host}
}

// RegisterFlags binds the node agent's own flags, with defaults from
// SHIZU_NODE_ID and SHIZU_SIMULATE.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if v, ok := os.LookupEnv("SHIZU_NODE_ID"); ok {
		c.NodeID = v
	}
	if v, ok := os.LookupEnv("SHIZU_SIMULATE"); ok {
		c.Simulate = v
	}
	fs.StringVar(&c.NodeID, "node-id", c.NodeID, "this host's node id, a subject token [SHIZU_NODE_ID]")
	fs.StringVar(&c.Simulate, "simulate", c.Simulate, "simulated GPU profile for hosts without GPUs, e.g. h100x8 [SHIZU_SIMULATE]")
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := subject.Token(c.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("node.id: %w", err))
	}
	return errors.Join(errs...)
}

// Run runs the node agent until ctx ends: it connects with the node-agent
// NATS user, ensures this node's command consumer and reports ready.
func Run(ctx context.Context, cfg Config) error {
	cmds, err := topology.AgentCommands(cfg.NodeID)
	if err != nil {
		return err
	}
	return service.Run(ctx, cfg.Service, service.DeclaredConsumers(cmds))
}
