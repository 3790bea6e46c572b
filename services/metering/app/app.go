// Package app wires the metering service to the bus and Redis and runs it.
// Its decisions live in packages beside it (pricing, ledger) that import
// neither NATS nor Redis; redisstore is its Redis adapter.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/shizu-gpu/shizu/services/metering/ledger"
	"github.com/shizu-gpu/shizu/services/metering/pricing"
	"github.com/shizu-gpu/shizu/services/metering/redisstore"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the metering's configuration.
type Config struct {
	Service service.Config
	// CataloguePath is the price catalogue file; empty means the shipped
	// catalogue (pricing/catalogue.json).
	CataloguePath string
	// AccountsPath is a JSON file of reserved commitments and budgets
	// ({"commitments": [...], "budgets": [...]}); empty means none.
	AccountsPath string
	// Rules are the billing interval and minimum charge.
	Rules ledger.Rules
	// CloseGrace is how long after an interval boundary a running rental's
	// record for it is closed, so a stop or a failover that happened before
	// the boundary arrives in time to end billing there.
	CloseGrace time.Duration
	// Tick is how often due intervals are looked for.
	Tick time.Duration
	// Concurrency is the number of batches handled at once per consumer
	// (deliveries at once for the spot price consumer).
	Concurrency int
	// Batch is the most rental events or usage records handled together:
	// their Redis work is one script call per step and their usage records
	// one async publish batch.
	Batch int
	// FastAck acknowledges without waiting for the server (handlers are
	// idempotent, so a lost ack only redelivers).
	FastAck bool
	// KeyPrefix prefixes every Redis key of metering.
	KeyPrefix string

	envErrs []error // SHIZU_METERING_* values that did not parse
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{Service: service.Defaults(topology.Metering), Rules: ledger.DefaultRules(),
		CloseGrace: 30 * time.Second, Tick: time.Second, Concurrency: 4, Batch: 500, FastAck: true, KeyPrefix: "mt:"}
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

// RegisterFlags binds the metering's own flags (the common ones are bound by
// service.Main). Defaults come from SHIZU_METERING_* variables.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.CataloguePath = envOr("SHIZU_METERING_CATALOGUE", c.CataloguePath)
	c.AccountsPath = envOr("SHIZU_METERING_ACCOUNTS", c.AccountsPath)
	fs.StringVar(&c.CataloguePath, "catalogue", c.CataloguePath, "price catalogue (JSON); empty uses the shipped one [SHIZU_METERING_CATALOGUE]")
	fs.StringVar(&c.AccountsPath, "accounts", c.AccountsPath, "reserved commitments and budgets (JSON) [SHIZU_METERING_ACCOUNTS]")
	fs.Func("interval", "usage record interval for running rentals [SHIZU_METERING_INTERVAL] (default "+c.Rules.Interval.String()+")", durationFlag(&c.Rules.Interval))
	fs.Func("minimum-charge", "minimum on-demand charge [SHIZU_METERING_MINIMUM_CHARGE] (default "+c.Rules.MinimumCharge.String()+")", durationFlag(&c.Rules.MinimumCharge))
	fs.DurationVar(&c.CloseGrace, "close-grace", c.CloseGrace, "wait after an interval boundary before closing a running rental's record")
	fs.DurationVar(&c.Tick, "tick", c.Tick, "how often due intervals are closed")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "batches handled at once per consumer")
	fs.IntVar(&c.Batch, "batch", c.Batch, "most events handled together in one batch")
	fs.BoolVar(&c.FastAck, "fast-ack", c.FastAck, "acknowledge without waiting for the server")
	for key, d := range map[string]*time.Duration{"SHIZU_METERING_INTERVAL": &c.Rules.Interval, "SHIZU_METERING_MINIMUM_CHARGE": &c.Rules.MinimumCharge} {
		if v, ok := os.LookupEnv(key); ok {
			if parsed, err := time.ParseDuration(v); err == nil {
				*d = parsed
			} else {
				c.envErrs = append(c.envErrs, fmt.Errorf("%s: %q is not a duration (e.g. 1m)", key, v))
			}
		}
	}
	if v, ok := os.LookupEnv("SHIZU_METERING_CONCURRENCY"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			c.Concurrency = n
		} else {
			c.envErrs = append(c.envErrs, fmt.Errorf("SHIZU_METERING_CONCURRENCY: %q is not a whole number", v))
		}
	}
}

func durationFlag(d *time.Duration) func(string) error {
	return func(s string) error {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	errs := append([]error{c.Service.Validate()}, c.envErrs...)
	if err := c.Rules.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("metering: %w", err))
	}
	if c.CloseGrace < 0 {
		errs = append(errs, fmt.Errorf("metering: close grace %s is negative", c.CloseGrace))
	}
	if c.Tick <= 0 {
		errs = append(errs, fmt.Errorf("metering: tick %s must be positive", c.Tick))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("metering: concurrency %d must be at least 1", c.Concurrency))
	}
	if c.Batch < 1 {
		errs = append(errs, fmt.Errorf("metering: batch %d must be at least 1", c.Batch))
	}
	if _, _, err := c.load(); err != nil {
		errs = append(errs, fmt.Errorf("metering: %w", err))
	}
	return errors.Join(errs...)
}

// load reads the catalogue and the accounts and checks them together.
func (c Config) load() (*pricing.Catalogue, ledger.Accounts, error) {
	var cat *pricing.Catalogue
	var err error
	if c.CataloguePath == "" {
		cat, err = pricing.Shipped()
	} else {
		cat, err = pricing.Load(c.CataloguePath)
	}
	if err != nil {
		return nil, ledger.Accounts{}, err
	}
	var acc ledger.Accounts
	if c.AccountsPath != "" {
		data, err := os.ReadFile(c.AccountsPath)
		if err != nil {
			return nil, ledger.Accounts{}, fmt.Errorf("accounts: %w", err)
		}
		if err := json.Unmarshal(data, &acc); err != nil {
			return nil, ledger.Accounts{}, fmt.Errorf("accounts %s: %w", c.AccountsPath, err)
		}
	}
	if err := acc.Validate(cat); err != nil {
		return nil, ledger.Accounts{}, fmt.Errorf("accounts %s: %w", c.AccountsPath, err)
	}
	return cat, acc, nil
}

// Run runs the metering until ctx ends: it connects with its own NATS user,
// ensures the durable consumers the topology declares for it, starts them
// and the interval closer, and reports ready on /readyz.
func Run(ctx context.Context, cfg Config) error {
	svc, _ := topology.ServiceNamed(topology.Metering)
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		if rt.Redis == nil {
			return nil, errors.New("metering needs Redis: set -redis-url")
		}
		if err := service.EnsureConsumers(ctx, rt, svc.Consumers...); err != nil {
			return nil, err
		}
		m, err := NewMeter(cfg, Deps{Store: redisstore.New(rt.Redis, cfg.KeyPrefix), Conn: rt.Bus, Log: rt.Log,
			Meter: rt.Telemetry.MeterProvider()})
		if err != nil {
			return nil, err
		}
		parts, err := m.Start(ctx, svc.Consumers, cfg.Tick)
		if err != nil {
			return nil, err
		}
		out := make([]service.Part, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, nil
	})
}
