// Package app wires the failover service to the bus and Redis and runs it.
// Its decisions live in packages beside it that import neither NATS nor
// Redis: detect (when a node is lost, flapping quarantine) and migrate
// (which rentals move and at which attempts, what the sweep recovers, storm
// order and pace, downtime). The app reaches its records, the bus and the
// capacity store's releases through narrow interfaces, whose contract
// suites are in failovertest.
//
// Watches: the HEARTBEATS bucket (every replica), and optionally the
// server's client-disconnect advisories. Consumes: node.<node>.{health,
// interruption,registered,drained} (durable "failover") and
// rental.<tenant>.{scheduled,started,stopped} (durable "failover-rentals").
// Publishes: node.<node>.lost, rental.<tenant>.migrating (the re-queue: it
// carries the spec and the next attempt), rental.<tenant>.migrated (with the
// downtime), agent.<node>.cmd.stop (the old run of a moved rental). Stores:
// its records in Redis (<prefix>:failover:*); fences, releases and
// drains through the capacity store.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/shizu-gpu/shizu/services/failover/detect"
	"github.com/shizu-gpu/shizu/services/failover/migrate"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the failover's configuration.
type Config struct {
	Service service.Config
	Detect  detect.Config
	Pace    migrate.Pace
	// Tick is how often suspicions and the move queue are looked at
	// without a new signal.
	Tick time.Duration
	// Sweep is how often a replica looks for work another replica left
	// half done (and how old such work must be).
	Sweep time.Duration
	// StopGrace is the grace period of the stop sent to a moved rental's
	// old run.
	StopGrace time.Duration
	// HeartbeatTTL is the bucket's TTL (the agents' setting).
	HeartbeatTTL time.Duration
	// KeyPrefix starts failover's Redis keys (default "shizu").
	KeyPrefix string
	// Advisory turns on the disconnect fast path.
	Advisory AdvisoryConfig
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{
		Service:      service.Defaults(topology.Failover),
		Detect:       detect.DefaultConfig(),
		Pace:         migrate.Pace{PerSecond: 500, Burst: 200},
		Tick:         100 * time.Millisecond,
		Sweep:        10 * time.Second,
		StopGrace:    10 * time.Second,
		HeartbeatTTL: 3 * time.Second,
		KeyPrefix:    "shizu",
	}
}

// RegisterFlags binds the failover's own flags (the common ones are bound by
// service.Main), each with a SHIZU_FAILOVER_<FLAG> variable (service.Flags):
// the advisory connection's are SHIZU_FAILOVER_ADVISORY_URL, _USER and
// _PASSWORD.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	f.Duration(&c.Detect.Confirm, "confirm", "how long an expired heartbeat stays suspect before the node is lost")
	f.Duration(&c.Detect.DisconnectGrace, "disconnect-grace", "after an agent disconnect, lost unless it beats within this long (agents beat at once on reconnect)")
	f.Duration(&c.Detect.FlapWindow, "flap-window", "window in which losses count as flapping")
	f.Int(&c.Detect.FlapThreshold, "flap-threshold", "losses within the window that quarantine a node")
	f.Duration(&c.Detect.QuarantineBase, "quarantine", "first quarantine of a flapping node (doubles per further loss)")
	f.Duration(&c.Detect.QuarantineMax, "quarantine-max", "longest quarantine")
	f.Float64(&c.Pace.PerSecond, "moves-per-second", "rentals handed to the scheduler per second in a storm")
	f.Int(&c.Pace.Burst, "moves-burst", "rentals handed to the scheduler at once")
	f.Duration(&c.Tick, "tick", "how often suspicions and queued moves are looked at")
	f.Duration(&c.Sweep, "sweep", "how often half-done work of a dead replica is looked for")
	f.Duration(&c.HeartbeatTTL, "heartbeat-ttl", "TTL of the heartbeat bucket (as the agents use it)")
	f.String(&c.Advisory.URL, "advisory-url", "NATS URL for client-disconnect advisories (system account user); empty disables the fast path")
	f.String(&c.Advisory.User, "advisory-user", "system account user for the advisories")
	f.String(&c.Advisory.Password, "advisory-password", "password of the advisory user; prefer the environment")
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Service.RedisURL == "" {
		errs = append(errs, errors.New("redis.url: failover fences through the capacity store in Redis; required"))
	}
	if err := c.Detect.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("failover.detect: %w", err))
	}
	if err := c.Pace.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("failover.pace: %w", err))
	}
	if c.Tick <= 0 {
		errs = append(errs, fmt.Errorf("failover.tick: %s, want > 0", c.Tick))
	}
	if c.Sweep <= 0 {
		errs = append(errs, fmt.Errorf("failover.sweep: %s, want > 0", c.Sweep))
	}
	if c.HeartbeatTTL < time.Second {
		errs = append(errs, fmt.Errorf("failover.heartbeat_ttl: %s, want >= 1s", c.HeartbeatTTL))
	}
	if c.Advisory.URL != "" && c.Advisory.User == "" {
		errs = append(errs, errors.New("failover.advisory.user: required with an advisory URL (a system account user)"))
	}
	return errors.Join(errs...)
}

// Run runs the failover until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	svc, _ := topology.ServiceNamed(topology.Failover)
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		if rt.Redis == nil {
			return nil, errors.New("failover: redis.url is required")
		}
		if err := service.EnsureConsumers(ctx, rt, svc.Consumers...); err != nil {
			return nil, err
		}
		hb, err := rt.Bus.OpenHeartbeats(ctx, topology.HeartbeatBucket, cfg.HeartbeatTTL)
		if err != nil {
			return nil, err
		}
		store, err := capacity.New(rt.Redis)
		if err != nil {
			return nil, err
		}
		m, err := NewMetrics(rt.Telemetry.MeterProvider())
		if err != nil {
			return nil, err
		}
		f, err := New(cfg, Deps{Bus: rt.Bus, Heartbeats: hb, Store: store, Redis: rt.Redis, Log: rt.Log, Metrics: m})
		if err != nil {
			return nil, err
		}
		return f.Start(ctx, svc.Consumers)
	})
}

// Start rebuilds the replica's records if they were lost (rebuild.go),
// then starts its consumers and its loops; the parts stop them.
func (f *Failover) Start(ctx context.Context, consumers []bus.Consumer) ([]service.Part, error) {
	if err := f.ensureRecords(ctx); err != nil {
		return nil, err
	}
	// Looks for a later loss of the records; stopped last.
	parts := []service.Part{service.StartLoop(context.WithoutCancel(ctx), f.cfg.Tick, f.watchRecords)}
	var disconnects <-chan Disconnect
	if f.cfg.Advisory.URL != "" {
		ch, stop, err := watchDisconnects(ctx, f.cfg.Advisory, f.d.Now, f.d.Log)
		if err != nil {
			return nil, err
		}
		disconnects = ch
		parts = append(parts, service.PartFunc(func(context.Context) error { stop(); return nil }))
	}
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.run(loopCtx, disconnects) }()
	parts = append(parts, service.PartFunc(func(context.Context) error {
		cancel()
		return <-done
	}))
	routers := map[string]*bus.Router{"failover": f.nodeRouter(), "failover-rentals": f.rentalRouter()}
	for _, c := range consumers {
		r, ok := routers[c.Durable]
		if !ok {
			return parts, fmt.Errorf("failover: no handler for declared consumer %s", c.Durable)
		}
		sub, err := f.d.Bus.Consume(ctx, c, r, bus.ConsumeOptions{})
		if err != nil {
			return parts, err
		}
		parts = append(parts, service.Subscription{Subscription: sub})
	}
	return parts, nil
}
