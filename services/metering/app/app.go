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
	// record is closed, so a stop before the boundary arrives in time
	// (docs/design/watermark.md, clock rule).
	CloseGrace time.Duration
	// ParkGrace is how long a start or stop of a placement whose
	// RentalScheduled metering has not seen waits for it (by the watermark
	// and the clock) before it is dead-lettered and dropped.
	ParkGrace time.Duration
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
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{Service: service.Defaults(topology.Metering), Rules: ledger.DefaultRules(),
		CloseGrace: 30 * time.Second, ParkGrace: 10 * time.Minute, Tick: time.Second, Concurrency: 4, Batch: 500, FastAck: true, KeyPrefix: "mt:"}
}

// RegisterFlags binds the metering's own flags (the common ones are bound by
// service.Main), each with a SHIZU_METERING_<FLAG> variable (service.Flags).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	f.String(&c.CataloguePath, "catalogue", "price catalogue (JSON); empty uses the shipped one")
	f.String(&c.AccountsPath, "accounts", "reserved commitments and budgets (JSON)")
	f.Duration(&c.Rules.Interval, "interval", "usage record interval for running rentals", service.Expect("a duration (e.g. 1m)"))
	f.Duration(&c.Rules.MinimumCharge, "minimum-charge", "minimum on-demand charge", service.Expect("a duration (e.g. 1m)"))
	f.Duration(&c.CloseGrace, "close-grace", "wait after an interval boundary before closing a running rental's record")
	f.Duration(&c.ParkGrace, "park-grace", "how long a start or stop waits for its rental's RentalScheduled before it is dead-lettered")
	f.Duration(&c.Tick, "tick", "how often due intervals are closed")
	f.Int(&c.Concurrency, "concurrency", "batches handled at once per consumer")
	f.Int(&c.Batch, "batch", "most events handled together in one batch")
	f.Bool(&c.FastAck, "fast-ack", "acknowledge without waiting for the server")
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	errs := []error{c.Service.Validate()}
	if err := c.Rules.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("metering: %w", err))
	}
	if c.CloseGrace < 0 {
		errs = append(errs, fmt.Errorf("metering: close grace %s is negative", c.CloseGrace))
	}
	if c.ParkGrace <= 0 {
		errs = append(errs, fmt.Errorf("metering: park grace %s must be positive", c.ParkGrace))
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
// ensures the durable consumers the topology declares for it, rebuilds its
// Redis state from the streams if it was lost (Recovery), starts the
// consumers, the interval closer, the money queries' answers
// (ServeQueries) and the recovery's watch for a later loss, and reports
// ready on /readyz.
func Run(ctx context.Context, cfg Config) error {
	svc, _ := topology.ServiceNamed(topology.Metering)
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		if rt.Redis == nil {
			return nil, errors.New("metering needs Redis: set -redis-url")
		}
		if err := service.EnsureConsumers(ctx, rt, svc.Consumers...); err != nil {
			return nil, err
		}
		// The meter writes through the guarded store: nothing is billed
		// from a store that lost its state until it is rebuilt.
		store := redisstore.New(rt.Redis, cfg.KeyPrefix)
		budgets, err := ensureBudgets(ctx, rt.Bus)
		if err != nil {
			return nil, err
		}
		m, err := NewMeter(cfg, Deps{Store: store.Guarded(), Conn: rt.Bus, Log: rt.Log,
			Meter: rt.Telemetry.MeterProvider(), Budgets: budgets})
		if err != nil {
			return nil, err
		}
		if err := m.LiftBudgets(ctx); err != nil {
			return nil, err
		}
		recovery := NewRecovery(m, store)
		if _, err := recovery.Ensure(ctx); err != nil {
			return nil, fmt.Errorf("metering store: %w", err)
		}
		parts, err := m.Start(ctx, svc.Consumers, cfg.Tick)
		if err != nil {
			return nil, err
		}
		queries, err := ServeQueries(ctx, cfg, QueryDeps{Conn: rt.Bus, Store: store, Log: rt.Log, Meter: rt.Telemetry.MeterProvider()})
		if err != nil {
			return nil, err
		}
		// Stopped first (parts stop in reverse order).
		return append(parts, queries, recovery.Watch(context.WithoutCancel(ctx), cfg.Tick)), nil
	})
}
