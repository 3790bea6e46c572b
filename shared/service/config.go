// Package service is the host every Shizu service runs in: configuration
// from flags and environment, telemetry, the NATS bus with the service's
// own credentials, Redis, and an HTTP endpoint for health and metrics, all
// started in order and shut down in reverse.
package service

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/bus"
	"github.com/shizu-gpu/shizu/shared/telemetry"
)

// Config is what every service needs, whatever it does.
type Config struct {
	// Name is the service name (also its NATS user by default).
	Name    string
	Version string
	NATS    bus.Config
	// RedisURL is a redis:// or rediss:// URL; empty means the service
	// does not use Redis.
	RedisURL string
	// HTTPAddr serves /healthz, /readyz and /metrics; empty disables it.
	HTTPAddr     string
	LogLevel     string
	LogFormat    string
	OTLPEndpoint string
	// ShutdownTimeout bounds the graceful drain (default 15 s).
	ShutdownTimeout time.Duration
	// LogWriter receives the service's logs (default stderr); not a flag.
	LogWriter io.Writer

	envErrs []error
}

// Defaults returns the configuration of service name on a developer
// machine: NATS and Redis on their standard local ports.
func Defaults(name string) Config {
	return Config{
		Name:            name,
		Version:         "dev",
		NATS:            bus.Config{URL: "nats://127.0.0.1:4222", Name: name, User: name},
		RedisURL:        "redis://127.0.0.1:6379/0",
		HTTPAddr:        ":9090",
		LogLevel:        "info",
		LogFormat:       telemetry.LogFormatJSON,
		ShutdownTimeout: 15 * time.Second,
	}
}

// RegisterFlags binds c's fields to flags on fs. Each flag's default is
// its environment variable when set, SHIZU_<SERVICE>_<FLAG> or the common
// name every service reads (SHIZU_NATS_URL for -nats-url and so on), else
// c's current value, so flags override the environment.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	f := c.Flags(fs)
	f.String(&c.NATS.URL, "nats-url", "NATS server URL(s), comma-separated", Alias("SHIZU_NATS_URL"))
	f.String(&c.NATS.User, "nats-user", "NATS user of this service", Alias("SHIZU_NATS_USER"))
	f.String(&c.NATS.Password, "nats-password", "NATS password; prefer the environment", Alias("SHIZU_NATS_PASSWORD"))
	f.String(&c.NATS.CAFile, "nats-ca", "CA certificate (PEM) that signed the NATS server's; enables TLS 1.3", Alias("SHIZU_NATS_CA"))
	f.String(&c.NATS.CertFile, "nats-cert", "client certificate (PEM) for mutual TLS", Alias("SHIZU_NATS_CERT"))
	f.String(&c.NATS.KeyFile, "nats-key", "client key (PEM) for mutual TLS", Alias("SHIZU_NATS_KEY"))
	f.String(&c.RedisURL, "redis-url", "Redis URL, e.g. redis://127.0.0.1:6379/0", Alias("SHIZU_REDIS_URL"))
	f.String(&c.HTTPAddr, "http-addr", "address of /healthz, /readyz and /metrics; empty disables", Alias("SHIZU_HTTP_ADDR"))
	f.String(&c.LogLevel, "log-level", "debug, info, warn or error", Alias("SHIZU_LOG_LEVEL"))
	f.String(&c.LogFormat, "log-format", "json or text", Alias("SHIZU_LOG_FORMAT"))
	f.String(&c.OTLPEndpoint, "otlp-endpoint", "OTLP/HTTP collector, host:port or URL; empty serves Prometheus /metrics instead",
		Alias("OTEL_EXPORTER_OTLP_ENDPOINT"))
	f.Duration(&c.ShutdownTimeout, "shutdown-timeout", "bound on the graceful drain at shutdown", Alias("SHIZU_SHUTDOWN_TIMEOUT"))
}

// Validate reports every problem, each prefixed by its section.
func (c Config) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	if c.Name == "" {
		errs = append(errs, errors.New("service.name: required"))
	}
	if err := c.NATS.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.RedisURL != "" {
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			errs = append(errs, fmt.Errorf("redis.url: %w", err))
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("http.addr: %w", err))
		}
	}
	if _, err := c.level(); err != nil {
		errs = append(errs, err)
	}
	if err := c.telemetry().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("service.shutdown_timeout: %s must be positive", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

func (c Config) level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(c.LogLevel))); err != nil {
		return 0, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	return l, nil
}

func (c Config) telemetry() telemetry.Config {
	level, _ := c.level()
	return telemetry.Config{
		ServiceName:    c.Name,
		ServiceVersion: c.Version,
		InstanceID:     hostname(),
		OTLPEndpoint:   c.OTLPEndpoint,
		LogLevel:       level,
		LogFormat:      c.LogFormat,
		LogWriter:      c.LogWriter,
	}
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
