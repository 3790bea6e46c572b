// Package bus is Shizu's typed layer over NATS JetStream: topology
// provisioning, publishing with deduplication ids and trace context,
// consuming with explicit acks, backoff redelivery and a dead-letter path,
// and node heartbeats in a KV bucket with per-key TTL.
package bus

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Config says how to reach NATS and who this client is.
type Config struct {
	// URL is one server URL or a comma-separated list (a cluster).
	URL string
	// Name is the connection name shown by the server (the service name).
	Name string
	// User and Password are this service's own credentials.
	User     string
	Password string
	// CAFile verifies the server; CertFile and KeyFile, when set, present a
	// client certificate. Any of them turns TLS on, with TLS 1.3 as minimum.
	CAFile   string
	CertFile string
	KeyFile  string
	// ConnectTimeout bounds the first connection (default 5 s).
	ConnectTimeout time.Duration
}

// Validate reports every problem in c, each prefixed by its field.
func (c Config) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("nats.url: required"))
	}
	if c.User == "" && c.Password != "" {
		errs = append(errs, errors.New("nats.password: set without nats.user"))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("nats.cert/nats.key: set both or neither"))
	}
	for field, path := range map[string]string{"nats.ca": c.CAFile, "nats.cert": c.CertFile, "nats.key": c.KeyFile} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	if c.ConnectTimeout < 0 {
		errs = append(errs, errors.New("nats.connect_timeout: must not be negative"))
	}
	return errors.Join(errs...)
}

// TLSConfig builds the client TLS configuration (TLS 1.3 minimum), or nil
// when no TLS file is configured.
func (c Config) TLSConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("nats.ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("nats.ca: %s holds no PEM certificate", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats.cert/nats.key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Instruments are the telemetry a connection reports through. Zero fields
// fall back to no-op providers, the W3C trace-context propagator and a
// discarding logger.
type Instruments struct {
	Tracer     trace.TracerProvider
	Meter      metric.MeterProvider
	Propagator propagation.TextMapPropagator
	Logger     *slog.Logger
}

func (i Instruments) withDefaults() Instruments {
	if i.Tracer == nil {
		i.Tracer = tracenoop.NewTracerProvider()
	}
	if i.Meter == nil {
		i.Meter = metricnoop.NewMeterProvider()
	}
	if i.Propagator == nil {
		i.Propagator = propagation.TraceContext{}
	}
	if i.Logger == nil {
		i.Logger = slog.New(slog.DiscardHandler)
	}
	return i
}

// Conn is a NATS connection with JetStream, owned by one service.
type Conn struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	prop    propagation.TextMapPropagator
	tracer  trace.Tracer
	metrics *metrics

	mu     sync.Mutex
	denied map[string][]chan error // subject -> waiters for a publish permission violation
}

// Connect dials NATS with cfg and returns a JetStream-capable connection.
// The client reconnects forever after the first success; the first dial is
// bounded by ctx and cfg.ConnectTimeout.
func Connect(ctx context.Context, cfg Config, inst Instruments) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inst = inst.withDefaults()
	c := &Conn{
		log:    inst.Logger.With("component", "bus"),
		prop:   inst.Propagator,
		tracer: inst.Tracer.Tracer(instrumentationName),
		denied: map[string][]chan error{},
	}
	m, err := newMetrics(inst.Meter)
	if err != nil {
		return nil, err
	}
	c.metrics = m
	timeout := cfg.ConnectTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ErrorHandler(c.asyncError),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				c.log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { c.log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted()) }),
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	tlsCfg, err := cfg.TLSConfig()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, nats.Secure(tlsCfg))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s as %q: %w", cfg.URL, cfg.User, err)
	}
	// An async publish the server never answers (refused by permissions,
	// lost in a reconnect) fails after this long instead of pending forever.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c.nc, c.js = nc, js
	return c, nil
}

// NATS returns the underlying core connection.
func (c *Conn) NATS() *nats.Conn { return c.nc }

// JetStream returns the underlying JetStream context.
func (c *Conn) JetStream() jetstream.JetStream { return c.js }

// Close waits (bounded by ctx) for outstanding async publishes, then drains
// the connection: subscriptions finish what they hold and pending writes are
// flushed before it closes.
func (c *Conn) Close(ctx context.Context) error {
	var errs []error
	select {
	case <-c.js.PublishAsyncComplete():
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("close: %d async publishes still unacknowledged: %w", c.js.PublishAsyncPending(), ctx.Err()))
	}
	closed := make(chan struct{})
	c.nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := c.nc.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return errors.Join(errs...)
		}
		c.nc.Close()
		return errors.Join(append(errs, err)...)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		c.nc.Close()
		errs = append(errs, fmt.Errorf("close: drain: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}

var publishViolation = regexp.MustCompile(`Permissions Violation for Publish to "([^"]+)"`)

// asyncError receives errors the server reports out of band. A publish
// permission violation is matched to the publish waiting on that subject,
// so the caller gets a clear error at once instead of a timeout.
func (c *Conn) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if m := publishViolation.FindStringSubmatch(err.Error()); m != nil {
		c.mu.Lock()
		waiters := c.denied[m[1]]
		c.mu.Unlock()
		for _, w := range waiters {
			select {
			case w <- err:
			default:
			}
		}
		c.log.Error("nats permission violation", "subject", m[1], "err", err)
		return
	}
	if sub != nil {
		c.log.Error("nats subscription error", "subject", sub.Subject, "err", err)
		return
	}
	c.log.Error("nats error", "err", err)
}

// watchDenied registers interest in a publish permission violation on
// subject; the returned func unregisters.
func (c *Conn) watchDenied(subject string) (<-chan error, func()) {
	ch := make(chan error, 1)
	c.mu.Lock()
	c.denied[subject] = append(c.denied[subject], ch)
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		ws := c.denied[subject]
		for i, w := range ws {
			if w == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(c.denied, subject)
		} else {
			c.denied[subject] = ws
		}
	}
}
