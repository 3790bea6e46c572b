package app_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/app"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

// gauges reads the scheduler's float gauges from a manual reader.
func gauges(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && len(g.DataPoints) == 1 {
				out[m.Name] = g.DataPoints[0].Value
			}
		}
	}
	return out
}

// One 1-GPU node; a 600 milli-GPU rental takes it. The window's workload is
// that one shape, which no longer fits the 400 left: all 400 are fragment.
// Gauges: amount 0.4 GPU, rate 1 (400 of 400 idle), allocation 0.6.
func TestTheFragmentationGaugesFollowTheView(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register(gpuNode("n1", 1, capacity.MarketOnDemand))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.WithoutCancel(t.Context())) })
	metrics, err := app.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	conn := e.connect(t)
	s, err := app.New(testConfig(), app.Deps{Bus: conn, Store: e.store, Redis: e.Redis.Client(t), Now: time.Now, Metrics: metrics,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := topology.ServiceNamed(topology.Scheduler)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	parts, err := s.Start(ctx, svc.Consumers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		stopCtx, stop := context.WithTimeout(context.WithoutCancel(t.Context()), 10*time.Second)
		defer stop()
		for i := len(parts) - 1; i >= 0; i-- {
			_ = parts[i].Stop(stopCtx)
		}
		_ = conn.Close(stopCtx)
	})
	if g := gauges(t, reader); len(g) != 0 {
		t.Fatalf("gauges before any view: %v", g)
	}
	e.publish(requested("r1", "acme", spec(1, 600, 8*1024, shizuv1.Plan_PLAN_ON_DEMAND), time.Now()))
	e.seen.waitFor(t, 20*time.Second, func(o *outcomes) error { _, err := scheduledOf(o, "r1"); return err })
	testkit.Eventually(t, 10*time.Second, func() error {
		if g := gauges(t, reader); math.Abs(g["shizu.scheduler.allocation.ratio"]-0.6) > 1e-9 {
			return fmt.Errorf("gauges %v", g)
		}
		return nil
	})
	g := gauges(t, reader)
	want := map[string]float64{"shizu.scheduler.fragmentation.amount": 0.4, "shizu.scheduler.fragmentation.rate": 1, "shizu.scheduler.allocation.ratio": 0.6}
	for name, v := range want {
		if math.Abs(g[name]-v) > 1e-9 {
			t.Errorf("%s = %v, want %v (all: %v)", name, g[name], v, g)
		}
	}
}
