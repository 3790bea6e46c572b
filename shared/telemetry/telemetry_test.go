package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shizu-gpu/shizu/shared/telemetry"
)

func TestSetupServesMetricsFromAPrivateRegistryPerService(t *testing.T) {
	t.Parallel()
	a := setup(t, telemetry.Config{ServiceName: "scheduler", InstanceID: "a-1"})
	b := setup(t, telemetry.Config{ServiceName: "metering", InstanceID: "b-1"})

	counter := func(tel *telemetry.Telemetry, n int64) {
		c, err := tel.Meter("shizu.test").Int64Counter("shizu.test.rentals")
		require.NoError(t, err)
		c.Add(t.Context(), n)
	}
	counter(a, 3)
	counter(b, 5)

	outA, outB := scrape(t, a.MetricsHandler()), scrape(t, b.MetricsHandler())
	assert.Regexp(t, `target_info\{[^}]*service_name="scheduler"`, outA)
	assert.Regexp(t, `shizu_test_rentals_total\{[^}]*\} 3\n`, outA)
	assert.NotContains(t, outA, "metering")
	assert.Regexp(t, `target_info\{[^}]*service_name="metering"`, outB)
	assert.Regexp(t, `shizu_test_rentals_total\{[^}]*\} 5\n`, outB)
}

func TestSetupExportsOverOTLPHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		config func(collectorURL string) telemetry.Config
	}{
		{"to an http:// URL", func(u string) telemetry.Config {
			return telemetry.Config{ServiceName: "scheduler", OTLPEndpoint: u}
		}},
		{"to a host:port marked insecure", func(u string) telemetry.Config {
			return telemetry.Config{ServiceName: "scheduler", OTLPEndpoint: strings.TrimPrefix(u, "http://"), OTLPInsecure: true}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			col := newCollector(t)
			tel, err := telemetry.Setup(t.Context(), tt.config(col.URL))
			require.NoError(t, err)

			_, span := tel.TracerProvider().Tracer("shizu.test").Start(t.Context(), "place")
			span.End()
			c, err := tel.Meter("shizu.test").Int64Counter("shizu.test.rentals")
			require.NoError(t, err)
			c.Add(t.Context(), 1)

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			require.NoError(t, tel.Shutdown(ctx))
			assert.Positive(t, col.bytes("/v1/traces"), "trace export")
			assert.Positive(t, col.bytes("/v1/metrics"), "metric export")
			assert.Equal(t, http.StatusNotFound, scrapeStatus(tel.MetricsHandler()))
		})
	}
}

func TestShutdownReturnsByTheDeadlineWhenTheCollectorIsDown(t *testing.T) {
	t.Parallel()
	for name, addr := range map[string]func(*testing.T) string{
		"refusing connections":          refusingAddr,
		"accepting but never answering": silentAddr,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tel, err := telemetry.Setup(t.Context(), telemetry.Config{
				ServiceName: "scheduler", OTLPEndpoint: addr(t), OTLPInsecure: true,
			})
			require.NoError(t, err)
			_, span := tel.TracerProvider().Tracer("shizu.test").Start(t.Context(), "place")
			span.End()

			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tel.Shutdown(ctx) }()
			select {
			case err := <-done: // nil or an export error; either way it returned
				t.Logf("Shutdown: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("Shutdown did not return after its context's deadline")
			}
		})
	}
}

func TestLoggerAddsTheSpansTraceIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		log  func(ctx context.Context, l *slog.Logger)
	}{
		{"on a plain logger", func(ctx context.Context, l *slog.Logger) {
			l.InfoContext(ctx, "rental placed", "gpus", 8)
		}},
		{"at the top level of a grouped logger", func(ctx context.Context, l *slog.Logger) {
			l.WithGroup("rental").With("id", "r-1").InfoContext(ctx, "rental placed", "gpus", 8)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			tel := setup(t, telemetry.Config{ServiceName: "scheduler", LogWriter: &buf})
			ctx, span := tel.TracerProvider().Tracer("shizu.test").Start(t.Context(), "place")
			defer span.End()

			tt.log(ctx, tel.Logger())

			var line map[string]any
			require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
			assert.Equal(t, span.SpanContext().TraceID().String(), line["trace_id"])
			assert.Equal(t, span.SpanContext().SpanID().String(), line["span_id"])
			assert.Equal(t, "scheduler", line["service"])
		})
	}
}

func TestTextLoggerAddsTraceIDsOnlyInsideASpan(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tel := setup(t, telemetry.Config{ServiceName: "scheduler", LogFormat: "text", LogWriter: &buf})
	tel.Logger().InfoContext(t.Context(), "outside")
	assert.NotContains(t, buf.String(), "trace_id")

	ctx, span := tel.TracerProvider().Tracer("shizu.test").Start(t.Context(), "place")
	defer span.End()
	tel.Logger().InfoContext(ctx, "inside")
	assert.Contains(t, buf.String(), "trace_id="+span.SpanContext().TraceID().String())
}

func TestLoggerRespectsTheLevel(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tel := setup(t, telemetry.Config{ServiceName: "scheduler", LogLevel: slog.LevelWarn, LogWriter: &buf})
	tel.Logger().Info("dropped")
	assert.Empty(t, buf.String())
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	valid := telemetry.Config{ServiceName: "scheduler"}
	tests := []struct {
		name    string
		mutate  func(*telemetry.Config)
		wantErr []string
	}{
		{"accepts the defaults", func(*telemetry.Config) {}, nil},
		{"accepts text logs and an https endpoint", func(c *telemetry.Config) {
			c.LogFormat, c.OTLPEndpoint, c.TraceSampleRatio = "text", "https://otel.example:4318", 0.5
		}, nil},
		{"rejects a missing service name", func(c *telemetry.Config) { c.ServiceName = "" }, []string{"ServiceName"}},
		{"rejects a bad log format", func(c *telemetry.Config) { c.LogFormat = "xml" }, []string{"LogFormat", `"xml"`}},
		{"rejects a negative sample ratio", func(c *telemetry.Config) { c.TraceSampleRatio = -0.1 }, []string{"TraceSampleRatio"}},
		{"rejects a sample ratio above one", func(c *telemetry.Config) { c.TraceSampleRatio = 2 }, []string{"TraceSampleRatio"}},
		{"rejects an endpoint without a port", func(c *telemetry.Config) { c.OTLPEndpoint = "collector" }, []string{"OTLPEndpoint"}},
		{"rejects a grpc scheme", func(c *telemetry.Config) { c.OTLPEndpoint = "grpc://collector:4317" }, []string{"OTLPEndpoint"}},
		{"reports every problem at once", func(c *telemetry.Config) {
			c.LogFormat, c.TraceSampleRatio = "xml", -1
		}, []string{"LogFormat", "TraceSampleRatio"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.wantErr == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestSetupRejectsAnInvalidConfig(t *testing.T) {
	t.Parallel()
	_, err := telemetry.Setup(t.Context(), telemetry.Config{ServiceName: "scheduler", LogFormat: "xml"})
	require.ErrorContains(t, err, "LogFormat")
}

func setup(t *testing.T, cfg telemetry.Config) *telemetry.Telemetry {
	t.Helper()
	tel, err := telemetry.Setup(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, tel.Shutdown(context.WithoutCancel(t.Context()))) })
	return tel
}

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.String()
}

func scrapeStatus(h http.Handler) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Code
}

// collector is an OTLP/HTTP endpoint that counts the bytes posted per path.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	received map[string]int
}

func newCollector(t *testing.T) *collector {
	c := &collector{received: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.received[r.URL.Path] += len(body)
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) bytes(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.received[path]
}

// refusingAddr returns a loopback address nothing listens on.
func refusingAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	return l.Addr().String()
}

// silentAddr returns a loopback address that accepts connections and never
// answers, like a collector that hangs.
func silentAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = conn.Close() })
		}
	}()
	return l.Addr().String()
}
