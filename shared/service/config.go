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

// RegisterFlags binds c's fields to flags on fs. Each flag's default is the
// matching environment variable when set (SHIZU_NATS_URL for -nats-url and
// so on), else c's current value, so flags override the environment.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.NATS.URL = c.env("SHIZU_NATS_URL", c.NATS.URL)
	c.NATS.User = c.env("SHIZU_NATS_USER", c.NATS.User)
	c.NATS.Password = c.env("SHIZU_NATS_PASSWORD", c.NATS.Password)
	c.NATS.CAFile = c.env("SHIZU_NATS_CA", c.NATS.CAFile)
	c.NATS.CertFile = c.env("SHIZU_NATS_CERT", c.NATS.CertFile)
	c.NATS.KeyFile = c.env("SHIZU_NATS_KEY", c.NATS.KeyFile)
	c.RedisURL = c.env("SHIZU_REDIS_URL", c.RedisURL)
	c.HTTPAddr = c.env("SHIZU_HTTP_ADDR", c.HTTPAddr)
	c.LogLevel = c.env("SHIZU_LOG_LEVEL", c.LogLevel)
	c.LogFormat = c.env("SHIZU_LOG_FORMAT", c.LogFormat)
	c.OTLPEndpoint = c.env("OTEL_EXPORTER_OTLP_ENDPOINT", c.OTLPEndpoint)
	c.ShutdownTimeout = c.envDuration("SHIZU_SHUTDOWN_TIMEOUT", c.ShutdownTimeout)

	fs.StringVar(&c.NATS.URL, "nats-url", c.NATS.URL, "NATS server URL(s), comma-separated [SHIZU_NATS_URL]")
	fs.StringVar(&c.NATS.User, "nats-user", c.NATS.User, "NATS user of this service [SHIZU_NATS_USER]")
	fs.StringVar(&c.NATS.Password, "nats-password", c.NATS.Password, "NATS password; prefer the environment [SHIZU_NATS_PASSWORD]")
	fs.StringVar(&c.NATS.CAFile, "nats-ca", c.NATS.CAFile, "CA certificate (PEM) that signed the NATS server's; enables TLS 1.3 [SHIZU_NATS_CA]")
	fs.StringVar(&c.NATS.CertFile, "nats-cert", c.NATS.CertFile, "client certificate (PEM) for mutual TLS [SHIZU_NATS_CERT]")
	fs.StringVar(&c.NATS.KeyFile, "nats-key", c.NATS.KeyFile, "client key (PEM) for mutual TLS [SHIZU_NATS_KEY]")
	fs.StringVar(&c.RedisURL, "redis-url", c.RedisURL, "Redis URL, e.g. redis://127.0.0.1:6379/0 [SHIZU_REDIS_URL]")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address of /healthz, /readyz and /metrics; empty disables [SHIZU_HTTP_ADDR]")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error [SHIZU_LOG_LEVEL]")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or text [SHIZU_LOG_FORMAT]")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", c.OTLPEndpoint, "OTLP/HTTP collector, host:port or URL; empty serves Prometheus /metrics instead [OTEL_EXPORTER_OTLP_ENDPOINT]")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "bound on the graceful drain at shutdown [SHIZU_SHUTDOWN_TIMEOUT]")
}

func (c *Config) env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func (c *Config) envDuration(key string, def time.Duration) time.Duration {
	v, ok := os.LookupEnv(key)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		c.envErrs = append(c.envErrs, fmt.Errorf("%s: %q is not a duration (e.g. 15s)", key, v))
		return def
	}
	return d
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
