package nvmlgpu

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

const probeSamples = 20

// ProbeReport is what Probe read from a host.
type ProbeReport struct {
	Inventory gpu.Inventory `json:"inventory"`
	// Samples are two telemetry samples, interval apart (rates need two).
	Samples [][]gpu.Sample `json:"samples"`
	// Events are the health events seen while watching.
	Events []gpu.Event `json:"events"`
	// SampleNsPerGPU is the mean cost of reading one GPU's telemetry (all
	// the NVML calls of one Sample, divided by the GPU count), over
	// probeSamples samples: the driver's share of the agent's telemetry cost.
	SampleNsPerGPU int64  `json:"sample_ns_per_gpu"`
	Took           string `json:"took"`
}

// Probe reads everything the agent would from h: the inventory, two
// telemetry samples interval apart, and any health event that arrives
// meanwhile; it writes the report to w as indented JSON.
func Probe(ctx context.Context, h gpu.Host, interval time.Duration, w io.Writer) (ProbeReport, error) {
	start := time.Now()
	var r ProbeReport
	inv, err := h.Discover(ctx)
	if err != nil {
		return r, fmt.Errorf("discover: %w", err)
	}
	r.Inventory = inv
	wctx, cancel := context.WithCancel(ctx)
	events := make(chan gpu.Event, 64)
	watched := make(chan error, 1)
	go func() { watched <- h.Watch(wctx, events) }()
	for i := range 2 {
		s, err := h.Sample(ctx, nil)
		if err != nil {
			cancel()
			return r, fmt.Errorf("sample: %w", err)
		}
		r.Samples = append(r.Samples, s)
		if i == 0 {
			select {
			case <-time.After(interval):
			case <-ctx.Done():
			}
		}
	}
	var buf []gpu.Sample
	t0 := time.Now()
	for range probeSamples {
		if buf, err = h.Sample(ctx, buf[:0]); err != nil {
			cancel()
			return r, fmt.Errorf("sample: %w", err)
		}
	}
	if n := len(inv.Devices); n > 0 {
		r.SampleNsPerGPU = time.Since(t0).Nanoseconds() / probeSamples / int64(n)
	}
	cancel()
	if err := <-watched; err != nil {
		return r, fmt.Errorf("watch: %w", err)
	}
	close(events)
	for ev := range events {
		r.Events = append(r.Events, ev)
	}
	r.Took = time.Since(start).Round(time.Millisecond).String()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return r, enc.Encode(r)
}
