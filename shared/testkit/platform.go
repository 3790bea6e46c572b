package testkit

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/quota"
	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Deployment is what Platform starts for one test: Shizu's infrastructure
// as a deployment has it. Everything is stopped and closed by t.Cleanup.
type Deployment struct {
	// NATS is the in-process server (JetStream on).
	NATS *NATS
	// Redis is the redis-server child, empty.
	Redis *Redis
	// Admin is a bus connection as the admin user, which provisioned the
	// streams (the test's stand-in for the gateway and other services).
	Admin *bus.Conn
	// Heartbeats is the heartbeat bucket, when WithHeartbeats asked for it
	// and it was provisioned.
	Heartbeats *bus.Heartbeats

	users        bool
	heartbeatTTL time.Duration
}

// PlatformOption adjusts what Platform starts.
type PlatformOption func(*platform)

type platform struct {
	users        bool
	provision    bool
	heartbeatTTL time.Duration
	nats         *NATS
	natsOptions  []func(*server.Options)
}

// WithoutUsers runs NATS without authentication: every connection may use
// every subject (for tests of a service's logic, not of its permissions).
func WithoutUsers() PlatformOption { return func(p *platform) { p.users = false } }

// WithoutStreams leaves the streams (and the heartbeat bucket)
// unprovisioned, for tests of what a service does before `shizu provision`
// ran; Deployment.Provision creates them later.
func WithoutStreams() PlatformOption { return func(p *platform) { p.provision = false } }

// WithHeartbeats provisions the node heartbeat bucket with ttl too.
func WithHeartbeats(ttl time.Duration) PlatformOption {
	return func(p *platform) { p.heartbeatTTL = ttl }
}

// OnNATS uses a NATS server the test started itself (with users, as
// Platform would; see Password) instead of starting one.
func OnNATS(n *NATS) PlatformOption { return func(p *platform) { p.nats = n } }

// WithNATSOptions adjusts the NATS server Platform starts.
func WithNATSOptions(mutate ...func(*server.Options)) PlatformOption {
	return func(p *platform) { p.natsOptions = append(p.natsOptions, mutate...) }
}

// Password is the password of every topology user on a Platform's NATS.
func Password(user string) string { return "pw-" + user }

// Platform starts an in-process NATS with the platform's users (shared/
// topology, each with its declared permissions and Password), a
// redis-server child, an admin connection, and provisions the streams
// (and, with WithHeartbeats, the heartbeat bucket). A missing redis-server
// fails the test with the fix.
func Platform(t testing.TB, opts ...PlatformOption) *Deployment {
	t.Helper()
	cfg := platform{users: true, provision: true}
	for _, o := range opts {
		o(&cfg)
	}
	d := &Deployment{NATS: cfg.nats, Redis: StartRedis(t), users: cfg.users, heartbeatTTL: cfg.heartbeatTTL}
	if d.NATS == nil {
		mutate := cfg.natsOptions
		if cfg.users {
			mutate = append([]func(*server.Options){WithUsers(topology.Users(), Password)}, mutate...)
		}
		d.NATS = StartNATS(t, mutate...)
	}
	d.Admin = d.Connect(t, topology.Admin)
	if cfg.provision {
		d.Provision(t)
	}
	return d
}

// Provision creates the streams, the tenant API's buckets, the quota
// bucket and, with WithHeartbeats, the heartbeat bucket, as `shizu
// provision` does.
func (d *Deployment) Provision(t testing.TB) {
	t.Helper()
	if err := d.Admin.EnsureStreams(t.Context(), topology.Streams(1)...); err != nil {
		t.Fatalf("testkit: provision the streams: %v", err)
	}
	if err := d.Admin.EnsureBuckets(t.Context(), topology.Buckets(1)...); err != nil {
		t.Fatalf("testkit: provision the buckets: %v", err)
	}
	if _, err := quota.Ensure(t.Context(), d.Admin.JetStream(), 1); err != nil {
		t.Fatalf("testkit: provision the quota bucket: %v", err)
	}
	if d.heartbeatTTL > 0 {
		hb, err := d.Admin.EnsureHeartbeats(t.Context(), topology.Heartbeats(1, d.heartbeatTTL))
		if err != nil {
			t.Fatalf("testkit: provision the heartbeat bucket: %v", err)
		}
		d.Heartbeats = hb
	}
}

// BusConfig is the bus configuration of user (a topology user) on this
// platform: its URL, name and, with users, its password.
func (d *Deployment) BusConfig(user string) bus.Config {
	cfg := bus.Config{URL: d.NATS.URL, Name: user}
	if d.users {
		cfg.User, cfg.Password = user, Password(user)
	}
	return cfg
}

// Connect is a bus connection as user, logging only errors, closed at
// cleanup.
func (d *Deployment) Connect(t testing.TB, user string) *bus.Conn {
	t.Helper()
	return d.ConnectWith(t, d.BusConfig(user), bus.Instruments{})
}

// ConnectWith is a bus connection with cfg and inst (a quiet logger when
// inst has none), closed at cleanup.
func (d *Deployment) ConnectWith(t testing.TB, cfg bus.Config, inst bus.Instruments) *bus.Conn {
	t.Helper()
	if inst.Logger == nil {
		inst.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	}
	c, err := bus.Connect(t.Context(), cfg, inst)
	if err != nil {
		t.Fatalf("testkit: connect as %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// RedisURL is the platform's Redis as a service's -redis-url.
func (d *Deployment) RedisURL() string { return "redis://" + d.Redis.Addr + "/0" }

// Capacity is a capacity store on the platform's Redis, with its own
// client (closed at cleanup).
func (d *Deployment) Capacity(t testing.TB, opts ...capacity.Option) *capacity.Store {
	t.Helper()
	s, err := capacity.New(d.Redis.Client(t), opts...)
	if err != nil {
		t.Fatalf("testkit: capacity store: %v", err)
	}
	return s
}

// ServiceConfig is the common configuration of service name on this
// platform: its NATS user and password, the Redis URL, no HTTP endpoint,
// text logs to the test's output and a 5 s drain.
func (d *Deployment) ServiceConfig(t testing.TB, name string) service.Config {
	cfg := service.Defaults(name)
	cfg.NATS = d.BusConfig(name)
	cfg.RedisURL = d.RedisURL()
	cfg.HTTPAddr = ""
	cfg.LogFormat = "text"
	cfg.LogWriter = t.Output()
	cfg.ShutdownTimeout = 5 * time.Second
	return cfg
}
