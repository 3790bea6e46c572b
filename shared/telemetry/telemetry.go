// Package telemetry sets up traces, metrics and logs for one Shizu service.
//
// Setup never touches the OpenTelemetry globals, because `shizu dev` runs
// every service in one process: each service gets its own providers, its own
// Prometheus registry and its own logger.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexp "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultShutdownTimeout bounds Shutdown when its context has no deadline.
// Without a reachable collector the OTLP exporters retry until the deadline.
const DefaultShutdownTimeout = 5 * time.Second

// Log formats accepted by Config.LogFormat.
const (
	LogFormatJSON = "json"
	LogFormatText = "text"
)

// Config describes the telemetry of one service.
type Config struct {
	ServiceName    string // required; becomes service.name
	ServiceVersion string // service.version
	InstanceID     string // service.instance.id; omitted when empty

	// OTLPEndpoint is the collector's OTLP/HTTP address, "host:port" or
	// "http(s)://host:port[/prefix]". Empty: no OTLP; metrics are served by
	// MetricsHandler instead and spans are only propagated and logged.
	OTLPEndpoint string
	// OTLPInsecure sends plain HTTP to a "host:port" endpoint. A URL's
	// scheme decides for itself.
	OTLPInsecure bool

	LogLevel  slog.Level
	LogFormat string    // LogFormatJSON (default) or LogFormatText
	LogWriter io.Writer // default os.Stderr

	// TraceSampleRatio is the share of new traces that are sampled, in
	// [0, 1]; 0 means the default, 1. Remote sampling decisions are honoured.
	TraceSampleRatio float64
}

// Validate reports every problem with the config.
func (c Config) Validate() error {
	var errs []error
	if c.ServiceName == "" {
		errs = append(errs, errors.New("ServiceName: required"))
	}
	if c.OTLPEndpoint != "" {
		if _, err := parseEndpoint(c.OTLPEndpoint, c.OTLPInsecure); err != nil {
			errs = append(errs, fmt.Errorf("OTLPEndpoint: %w", err))
		}
	}
	switch c.LogFormat {
	case "", LogFormatJSON, LogFormatText:
	default:
		errs = append(errs, fmt.Errorf("LogFormat: must be %q or %q, got %q", LogFormatJSON, LogFormatText, c.LogFormat))
	}
	if c.TraceSampleRatio < 0 || c.TraceSampleRatio > 1 {
		errs = append(errs, fmt.Errorf("TraceSampleRatio: must be within [0, 1], got %v", c.TraceSampleRatio))
	}
	return errors.Join(errs...)
}

// Telemetry holds one service's providers and logger.
type Telemetry struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	logger   *slog.Logger
	metrics  http.Handler
	shutdown []func(context.Context) error

	once        sync.Once
	shutdownErr error
}

// Setup builds the tracer and meter providers, the propagator and the logger
// described by cfg. Call Shutdown to flush them.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("telemetry config: %w", err)
	}
	res, err := newResource(cfg)
	if err != nil {
		return nil, err
	}
	t := &Telemetry{
		prop:    propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		logger:  newLogger(cfg),
		metrics: http.NotFoundHandler(),
	}

	ratio := cfg.TraceSampleRatio
	if ratio == 0 {
		ratio = 1
	}
	traceOpts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	var reader sdkmetric.Reader
	if cfg.OTLPEndpoint == "" {
		// A private registry: services sharing a process must not collide.
		reg := prometheus.NewRegistry()
		exp, err := promexp.New(promexp.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
		}
		reader = exp
		t.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	} else {
		target, _ := parseEndpoint(cfg.OTLPEndpoint, cfg.OTLPInsecure) // validated above
		spanExp, err := otlptracehttp.New(ctx, target.traceOptions()...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp trace exporter: %w", err)
		}
		metricExp, err := otlpmetrichttp.New(ctx, target.metricOptions()...)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("telemetry: otlp metric exporter: %w", err), spanExp.Shutdown(ctx))
		}
		traceOpts = append(traceOpts, sdktrace.WithBatcher(spanExp))
		reader = sdkmetric.NewPeriodicReader(metricExp)
	}

	tp := sdktrace.NewTracerProvider(traceOpts...)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	t.tp, t.mp = tp, mp
	t.shutdown = []func(context.Context) error{tp.Shutdown, mp.Shutdown}
	return t, nil
}

// TracerProvider returns the service's tracer provider.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tp }

// MeterProvider returns the service's meter provider.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.mp }

// Propagator returns the W3C TraceContext and Baggage propagator.
func (t *Telemetry) Propagator() propagation.TextMapPropagator { return t.prop }

// Logger returns the service's logger; records logged with a span's context
// carry trace_id and span_id.
func (t *Telemetry) Logger() *slog.Logger { return t.logger }

// Meter returns a meter of the service's provider.
func (t *Telemetry) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return t.mp.Meter(name, opts...)
}

// MetricsHandler serves the service's metrics in the Prometheus text format.
// It answers 404 when metrics are exported over OTLP instead.
func (t *Telemetry) MetricsHandler() http.Handler { return t.metrics }

// Shutdown flushes and stops the providers. It returns by ctx's deadline, or
// after DefaultShutdownTimeout when ctx has none, even when the collector is
// unreachable. Later calls return the first call's result.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.once.Do(func() {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, DefaultShutdownTimeout)
			defer cancel()
		}
		// Concurrently, so a stuck trace flush does not eat the metrics' time.
		errs := make([]error, len(t.shutdown))
		var wg sync.WaitGroup
		for i, stop := range t.shutdown {
			wg.Go(func() { errs[i] = stop(ctx) })
		}
		wg.Wait()
		t.shutdownErr = errors.Join(errs...)
	})
	return t.shutdownErr
}

func newResource(cfg Config) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{semconv.ServiceName(cfg.ServiceName)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.ServiceVersion))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.InstanceID))
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL, attrs...))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

func newLogger(cfg Config) *slog.Logger {
	w := cfg.LogWriter
	if w == nil {
		w = os.Stderr
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if cfg.LogFormat == LogFormatText {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(NewLogHandler(h)).With("service", cfg.ServiceName)
}

// otlpTarget is where the OTLP/HTTP exporters send to.
type otlpTarget struct {
	host       string // host:port
	pathPrefix string // prepended to /v1/traces and /v1/metrics
	insecure   bool
}

func parseEndpoint(endpoint string, insecure bool) (otlpTarget, error) {
	if !strings.Contains(endpoint, "://") {
		if _, _, err := net.SplitHostPort(endpoint); err != nil {
			return otlpTarget{}, fmt.Errorf("want host:port or http(s)://host:port, got %q", endpoint)
		}
		return otlpTarget{host: endpoint, insecure: insecure}, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return otlpTarget{}, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return otlpTarget{}, fmt.Errorf("want host:port or http(s)://host:port, got %q", endpoint)
	}
	return otlpTarget{host: u.Host, pathPrefix: u.Path, insecure: u.Scheme == "http"}, nil
}

func (o otlpTarget) traceOptions() []otlptracehttp.Option {
	opts := []otlptracehttp.Option{
		otlptracehttp.WithEndpoint(o.host),
		otlptracehttp.WithURLPath(path.Join("/", o.pathPrefix, "v1/traces")),
	}
	if o.insecure {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts
}

func (o otlpTarget) metricOptions() []otlpmetrichttp.Option {
	opts := []otlpmetrichttp.Option{
		otlpmetrichttp.WithEndpoint(o.host),
		otlpmetrichttp.WithURLPath(path.Join("/", o.pathPrefix, "v1/metrics")),
	}
	if o.insecure {
		opts = append(opts, otlpmetrichttp.WithInsecure())
	}
	return opts
}
