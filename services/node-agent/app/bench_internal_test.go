package app

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/protobuf/proto"

	"github.com/shizu-gpu/shizu/services/node-agent/agent"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
)

// BenchmarkTelemetrySample measures what one telemetry tick costs the
// agent per GPU: reading every GPU through the NVML backend (over the
// simulated driver, so driver latency is not included: the nvml-probe
// measures that on a GPU host), health bookkeeping, OTel gauges, building
// and encoding NodeTelemetry. "backend" is the NVML backend's share alone,
// measured in the same run; cpu-%/gpu is the share of one core one GPU
// costs at the default 5 s interval.
func BenchmarkTelemetrySample(b *testing.B) {
	for _, profile := range []string{"h100x8", "rtx4090x8"} {
		f, err := simgpu.New(profile, 1)
		if err != nil {
			b.Fatal(err)
		}
		h, err := f.Host()
		if err != nil {
			b.Fatal(err)
		}
		inv, err := h.Discover(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		n := len(inv.Devices)
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		m, err := newMetrics(mp.Meter(meterName), func() int64 { return 0 })
		if err != nil {
			b.Fatal(err)
		}
		m.setGPUs(inv.Devices)
		book := agent.NewHealthBook(n)
		ctx := context.Background()
		var samples []gpu.Sample

		b.Run(profile+"/backend", func(b *testing.B) {
			for b.Loop() {
				if samples, err = h.Sample(ctx, samples[:0]); err != nil {
					b.Fatal(err)
				}
			}
			perGPU := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(n)
			b.ReportMetric(perGPU, "ns/gpu")
		})
		b.Run(profile+"/pipeline", func(b *testing.B) {
			for b.Loop() {
				if samples, err = h.Sample(ctx, samples[:0]); err != nil {
					b.Fatal(err)
				}
				m.record(ctx, samples)
				for _, s := range samples {
					book.Sample(s)
				}
				if _, err := proto.Marshal(agent.Events{NodeID: "gpu-node-17", Source: "node-agent/gpu-node-17"}.Telemetry(3, time.Now(), samples)); err != nil {
					b.Fatal(err)
				}
			}
			perGPU := float64(b.Elapsed().Nanoseconds()) / float64(b.N) / float64(n)
			b.ReportMetric(perGPU, "ns/gpu")
			b.ReportMetric(perGPU/float64(5*time.Second)*100, "cpu-%/gpu@5s")
		})
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil || len(rm.ScopeMetrics) == 0 {
			b.Fatalf("no metrics recorded: %v", err)
		}
		_ = h.Close()
	}
}
