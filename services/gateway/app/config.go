// Package app is the tenant API's HTTP server: the OpenAPI document it
// serves and validates requests against, API keys (services/gateway/
// identity), per-key rate limits, idempotent POSTs, the audit log, and the
// rental endpoints, which publish for the key's tenant and read the rental
// read model (shared/rentalview), whose projector every replica runs.
package app

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/shizu-gpu/shizu/shared/service"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// Config is the gateway's configuration.
type Config struct {
	Service service.Config
	// Listen is the address of the tenant API (the health and metrics
	// endpoint is Service.HTTPAddr).
	Listen string
	// OnListen, when set, is told the address the API listens on once it
	// does (Listen may be "127.0.0.1:0"); not a flag: for `shizu dev`.
	OnListen func(addr string)
	Options
}

// Options are what the API itself is configured with.
type Options struct {
	// RatePerSecond and RateBurst are each API key's token bucket: calls
	// per second on average, and at once.
	RatePerSecond float64
	RateBurst     int
	// MaxPriority bounds RentalSpec.priority a tenant may ask for.
	MaxPriority int
	// Projector runs the rental read model's projector in this process
	// (every replica shares one durable; one applies at a time).
	Projector bool
	// Replicas is the replica count of the buckets the gateway ensures
	// (1 on a single server, 3 on a cluster).
	Replicas int
	// WebhookLoopback lets tenants register http webhooks to a loopback
	// address (shizu dev, tests); otherwise webhooks must be https.
	WebhookLoopback bool
	// WebhookRetryInitial and WebhookRetryFor are a webhook delivery's
	// first retry interval (doubling, at most a minute) and how long it is
	// retried before it is given up.
	WebhookRetryInitial time.Duration
	WebhookRetryFor     time.Duration
	// CataloguePath is the price catalogue file metering is started with
	// (services/metering/pricing's format); GET /v1/models answers its
	// on-demand prices. Empty: models without prices.
	CataloguePath string
}

// DefaultOptions are the options on a developer machine.
func DefaultOptions() Options {
	return Options{RatePerSecond: 20, RateBurst: 40, MaxPriority: 100, Projector: true, Replicas: 1,
		WebhookRetryInitial: time.Second, WebhookRetryFor: 30 * time.Minute}
}

// DefaultConfig is the configuration on a developer machine.
func DefaultConfig() Config {
	svc := service.Defaults(topology.Gateway)
	svc.RedisURL = "" // the gateway keeps its state in JetStream
	return Config{Service: svc, Listen: ":8080", Options: DefaultOptions()}
}

// RegisterFlags binds the gateway's own flags (the common ones are bound
// by service.Main), each with a SHIZU_GATEWAY_<FLAG> variable.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Service.Flags(fs)
	f.String(&c.Listen, "listen", "address of the tenant API (host:port)")
	f.Float64(&c.RatePerSecond, "rate", "calls per second each API key may make on average")
	f.Int(&c.RateBurst, "burst", "calls each API key may make at once")
	f.Int(&c.MaxPriority, "max-priority", "highest rental priority a tenant may ask for (0..1000)")
	f.Bool(&c.Projector, "projector", "run the rental read model's projector in this process")
	f.Bool(&c.WebhookLoopback, "webhook-loopback", "allow http webhooks to loopback addresses (development only)")
	f.Duration(&c.WebhookRetryFor, "webhook-retry-for", "how long a failing webhook delivery is retried before it is given up")
	f.String(&c.CataloguePath, "catalogue", "price catalogue (JSON, metering's format) whose on-demand prices GET /v1/models answers; empty: no prices")
	f.Int(&c.Replicas, "replicas", "replicas of the IDENTITY and IDEMPOTENCY buckets (1, or 3 on a cluster)")
}

// Validate reports every problem in the configuration.
func (c Config) Validate() error {
	errs := []error{c.Service.Validate()}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("gateway.listen: %w", err))
	}
	errs = append(errs, c.Options.Validate())
	return errors.Join(errs...)
}

// Validate reports every problem in o.
func (o Options) Validate() error {
	var errs []error
	if o.RatePerSecond <= 0 {
		errs = append(errs, fmt.Errorf("gateway.rate: %g must be positive", o.RatePerSecond))
	}
	if o.RateBurst < 1 {
		errs = append(errs, fmt.Errorf("gateway.burst: %d must be at least 1", o.RateBurst))
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("gateway.replicas: %d is out of range 1..5", o.Replicas))
	}
	if o.MaxPriority < 0 || o.MaxPriority > 1000 {
		errs = append(errs, fmt.Errorf("gateway.max_priority: %d is out of range 0..1000", o.MaxPriority))
	}
	if o.WebhookRetryInitial <= 0 || o.WebhookRetryFor <= 0 {
		errs = append(errs, fmt.Errorf("gateway.webhook_retry_for: %s (first retry after %s) must be positive", o.WebhookRetryFor, o.WebhookRetryInitial))
	}
	return errors.Join(errs...)
}

// requestTimeout bounds one non-streaming call's work on the bus.
const requestTimeout = 10 * time.Second
