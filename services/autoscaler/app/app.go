// Package app wires the autoscaler service to the bus, Redis and a node
// provider, and runs it. Its decisions live in packages beside it that
// import neither NATS nor Redis: policy (pools), fleet (nodes), and the
// provider interface.
//
// Consumes: traffic.<pool>.sample (pool decisions), scale.fleet.shortage
// (provisioning), scale.<pool>.declared (pools declared through the bus),
// node.<node>.telemetry (which nodes work),
// rental.<tenant>.rejected and .stopped (pool replicas lost). Publishes:
// scale.<pool>.decided with the rule and metric, rental.<tenant>.requested
// and .cancel_requested for pool replicas, scale.fleet.provision_requested
// and .release_requested, and agent.<node>.cmd.drain before a release.
// Stores in Redis: per-pool state (<prefix>:autoscaler:pool:{<pool>}), the
// pools declared through the bus (<prefix>:autoscaler:pools), the fleet's
// provisioning claims and provisioned nodes (<prefix>:autoscaler:{fleet}:*);
// reads the capacity store to see which nodes hold rentals.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/policy"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the autoscaler's configuration.
type Config struct {
	Service service.Config
	// PolicyFile is the pools and fleet policy (JSON); empty means no
	// pools and no provisioning.
	PolicyFile string
	// Tick is how often pools (pre-warm, scale-to-zero) and the fleet
	// (drain, release) are re-evaluated without an event.
	Tick time.Duration
	// NodeAgentBinary enables the local provider: provisioned nodes are
	// simulated node-agents started from this executable.
	NodeAgentBinary string
	// AgentNATSPassword is the node-agent user's password handed to the
	// agents the local provider starts.
	AgentNATSPassword string
	// SpotCapacity bounds the local provider's spot nodes (-1 unlimited).
	SpotCapacity int
	// KeyPrefix starts the autoscaler's Redis keys (default "shizu").
	KeyPrefix string
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	return Config{Service: service.Defaults(topology.Autoscaler), Tick: 5 * time.Second, SpotCapacity: -1, KeyPrefix: "shizu"}
}

// RegisterFlags binds the autoscaler's own flags, each with a
// SHIZU_AUTOSCALER_<FLAG> variable (service.Flags).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	f.String(&c.PolicyFile, "policy", "pools and fleet policy file (JSON)")
	f.Duration(&c.Tick, "tick", "how often pools and the fleet are re-evaluated without an event")
	f.String(&c.NodeAgentBinary, "node-agent", "node-agent executable for the local provider; empty disables provisioning")
	f.String(&c.AgentNATSPassword, "agent-nats-password", "NATS password of the node-agent user, handed to the agents the local provider starts",
		service.Alias("SHIZU_NODE_AGENT_NATS_PASSWORD"))
	f.Int(&c.SpotCapacity, "spot-capacity", "spot nodes the local provider can supply at once, -1 unlimited")
}

// Validate reports every problem in the configuration, including the
// policy file's.
func (c Config) Validate() error {
	var errs []error
	if err := c.Service.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Tick <= 0 {
		errs = append(errs, fmt.Errorf("autoscaler.tick: %s must be positive", c.Tick))
	}
	if c.SpotCapacity < -1 {
		errs = append(errs, fmt.Errorf("autoscaler.spot-capacity: %d; want -1 (unlimited) or more", c.SpotCapacity))
	}
	if c.Service.RedisURL == "" {
		errs = append(errs, errors.New("redis.url: the autoscaler keeps pool state in Redis; required"))
	}
	if c.PolicyFile != "" {
		if _, err := loadPolicy(c.PolicyFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func loadPolicy(path string) (policy.File, error) {
	if path == "" {
		return policy.File{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return policy.File{}, fmt.Errorf("autoscaler.policy: %w", err)
	}
	f, err := policy.Parse(data)
	if err != nil {
		return policy.File{}, fmt.Errorf("autoscaler.policy %s:\n%w", path, err)
	}
	return f, nil
}

// Deps are what an embedding process (tests, `shizu dev`) may inject.
type Deps struct {
	// Provider replaces the local provider built from the config.
	Provider provider.Provider
	// NewProvider, when Provider is nil and the policy's fleet section
	// sells instance types, builds the fleet provider in place of the
	// local one. It is called once, with each instance type's simulated
	// profile by type name (the fleet section's InstanceTypes), so an
	// embedding process (`shizu dev`) need not read the policy file.
	NewProvider func(profiles map[string]string) (provider.Provider, error)
	// Policy replaces the policy file.
	Policy *policy.File
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Run runs the autoscaler until ctx ends.
func Run(ctx context.Context, cfg Config) error { return RunWith(ctx, cfg, Deps{}) }

// RunWith runs the autoscaler with injected dependencies: it consumes
// traffic samples, capacity shortages and telemetry, and ticks pools and
// the fleet every cfg.Tick.
func RunWith(ctx context.Context, cfg Config, deps Deps) error {
	file, err := resolve(&cfg, &deps)
	if err != nil {
		return err
	}
	return service.Run(ctx, cfg.Service, func(ctx context.Context, rt *service.Runtime) ([]service.Part, error) {
		if rt.Redis == nil {
			return nil, errors.New("autoscaler: redis.url is required")
		}
		caps, err := capacity.New(rt.Redis)
		if err != nil {
			return nil, err
		}
		m, err := newMetrics(rt.Telemetry.MeterProvider())
		if err != nil {
			return nil, err
		}
		prov, parts, err := fleetProvider(cfg, deps, file.Fleet)
		if err != nil {
			return nil, err
		}
		s := newScaler(rt.Bus, rt.Redis, cfg.KeyPrefix, caps, prov, file, deps.Now, rt.Log, m)
		s.guard()
		js := rt.Bus.JetStream()
		if err := s.ensureState(ctx, js); err != nil {
			return parts, fmt.Errorf("autoscaler state: %w", err)
		}
		// Looks for a later loss of the state (rebuild.go).
		parts = append(parts, service.StartLoop(ctx, cfg.Tick, s.watchState(js)))
		subs, err := consume(ctx, rt, s)
		parts = append(parts, subs...)
		if err != nil {
			return parts, err
		}
		parts = append(parts, service.StartLoop(ctx, cfg.Tick, func(ctx context.Context, _ time.Time) {
			if !s.ready.Load() {
				return // the state is being rebuilt
			}
			now := s.now() // the injected clock, not the ticker's
			s.tickPools(ctx, now)
			if err := s.tickFleet(ctx, now); err != nil {
				s.log.WarnContext(ctx, "fleet tick failed", "err", err)
			}
		}))
		return parts, nil
	})
}

// resolve fills cfg's and deps' defaults and returns the policy: deps.Policy
// when given, else the file at cfg.PolicyFile.
func resolve(cfg *Config, deps *Deps) (policy.File, error) {
	var file policy.File
	if deps.Policy != nil {
		file = *deps.Policy
		if err := file.Validate(); err != nil {
			return file, fmt.Errorf("autoscaler policy:\n%w", err)
		}
	} else {
		var err error
		if file, err = loadPolicy(cfg.PolicyFile); err != nil {
			return file, err
		}
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "shizu"
	}
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultConfig().Tick
	}
	return file, nil
}

// consume starts one subscription per consumer the topology declares for
// the autoscaler, each delivering to s's handlers for it.
func consume(ctx context.Context, rt *service.Runtime, s *scaler) ([]service.Part, error) {
	routes := map[string][]func(*bus.Router){
		"autoscaler-traffic":   {func(r *bus.Router) { bus.On(r, s.onSample) }},
		"autoscaler-shortage":  {func(r *bus.Router) { bus.On(r, s.onShortage) }},
		"autoscaler-pools":     {func(r *bus.Router) { bus.On(r, s.onPoolDeclared) }},
		"autoscaler-telemetry": {func(r *bus.Router) { bus.On(r, s.onTelemetry) }},
		"autoscaler-rentals": {
			func(r *bus.Router) { bus.On(r, s.onRentalRejected) },
			func(r *bus.Router) { bus.On(r, s.onRentalStopped) },
		},
	}
	svc, _ := topology.ServiceNamed(topology.Autoscaler)
	if err := service.EnsureConsumers(ctx, rt, svc.Consumers...); err != nil {
		return nil, err
	}
	var parts []service.Part
	for _, c := range svc.Consumers {
		handlers, ok := routes[c.Durable]
		if !ok {
			return parts, fmt.Errorf("autoscaler: no handler for declared consumer %s", c.Durable)
		}
		r := bus.NewRouter()
		for _, on := range handlers {
			on(r)
		}
		sub, err := rt.Bus.Consume(ctx, c, r, bus.ConsumeOptions{})
		if err != nil {
			return parts, err
		}
		parts = append(parts, service.Subscription{Subscription: sub})
	}
	return parts, nil
}

// newScaler builds the scaler of one replica; everything it shares with
// other replicas lives in Redis under prefix.
func newScaler(pub publisher, rdb *redis.Client, prefix string, caps *capacity.Store, prov provider.Provider, file policy.File,
	now func() time.Time, log *slog.Logger, m metrics) *scaler {
	s := &scaler{pub: pub, states: stateStore{rdb: rdb, prefix: prefix}, fleet: fleetStore{rdb: rdb, prefix: prefix},
		declared: poolStore{rdb: rdb, prefix: prefix},
		caps:     caps, prov: prov, file: file, pools: map[string]policy.Pool{}, now: now, log: log, m: m,
		idle: map[string]time.Time{}, busyAt: map[string]time.Time{}}
	for _, p := range file.Pools {
		s.pools[p.ID] = p
	}
	// Ready until a look at the marker says otherwise (RunWith looks
	// before it consumes anything).
	s.ready.Store(true)
	return s
}

// guard makes the scaler's pool and fleet writes refuse while the state's
// marker is missing (rebuild.go); RunWith guards its scaler.
func (s *scaler) guard() {
	s.states.marker, s.fleet.marker = s.markerKey(), s.markerKey()
}

// fleetProvider is the provider of more nodes: the injected one, else the
// embedder's (deps.NewProvider, when the fleet sells instance types), else
// the local provider when cfg names a node-agent binary, else none (no
// provisioning). The parts stop what it started.
func fleetProvider(cfg Config, deps Deps, fc fleet.Config) (provider.Provider, []service.Part, error) {
	switch {
	case deps.Provider != nil:
		return deps.Provider, nil, nil
	case deps.NewProvider != nil && len(fc.InstanceTypes) > 0:
		prov, err := deps.NewProvider(profilesOf(fc))
		if err != nil {
			return nil, nil, fmt.Errorf("autoscaler provider: %w", err)
		}
		return prov, nil, nil
	case cfg.NodeAgentBinary != "":
		local, err := newLocalProvider(cfg, fc)
		if err != nil {
			return nil, nil, err
		}
		return local, []service.Part{service.PartFunc(local.Close)}, nil
	}
	return nil, nil, nil
}

// profilesOf maps each instance type the fleet sells to the simulated
// profile a node of it runs.
func profilesOf(fc fleet.Config) map[string]string {
	profiles := map[string]string{}
	for _, t := range fc.InstanceTypes {
		profiles[t.Name] = t.Profile
	}
	return profiles
}

func newLocalProvider(cfg Config, fc fleet.Config) (*provider.Local, error) {
	return provider.NewLocal(provider.LocalConfig{
		Binary:   cfg.NodeAgentBinary,
		Profiles: profilesOf(fc),
		Env: map[string]string{
			"SHIZU_NATS_URL": cfg.Service.NATS.URL, "SHIZU_NATS_USER": topology.NodeAgent,
			"SHIZU_NATS_PASSWORD": cfg.AgentNATSPassword, "SHIZU_REDIS_URL": cfg.Service.RedisURL,
			// Agents listen for health on a port of their own choosing.
			"SHIZU_HTTP_ADDR": "127.0.0.1:0",
		},
		SpotCapacity: cfg.SpotCapacity,
		Output:       os.Stderr,
	})
}
