package app_test

import (
	"context"
	"net/http/httptest"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shizu-gpu/shizu/services/gateway/app"
	"github.com/shizu-gpu/shizu/shared/testkit"
	"github.com/shizu-gpu/shizu/shared/topology"
)

func TestCallsAreCountedByRouteAndStatusWithoutTenants(t *testing.T) {
	t.Parallel()
	d := testkit.Platform(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(cancel)
	g, err := app.Open(ctx, d.Connect(t, topology.Gateway), testOptions(), nil, mp)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		g.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/rentals", nil))
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "shizu.gateway.requests" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				route, _ := p.Attributes.Value("http.route")
				status, _ := p.Attributes.Value("http.response.status_code")
				if route.AsString() == "/v1/rentals" && status.AsString() == "401" && p.Value == 2 && p.Attributes.Len() == 3 {
					return
				}
			}
		}
	}
	t.Fatalf("no count of 2 unauthorized GET /v1/rentals in %+v", rm.ScopeMetrics)
}
