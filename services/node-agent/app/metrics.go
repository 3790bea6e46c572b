package app

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

// Meter name, metric names and attribute keys of the node agent. Labels
// are low-cardinality: GPU index (0..63), model, direction, verb, outcome;
// never a rental id.
const (
	meterName = "github.com/shizu-gpu/shizu/services/node-agent"

	attrGPU       = attribute.Key("shizu.gpu.index")
	attrModel     = attribute.Key("shizu.gpu.model")
	attrDirection = attribute.Key("shizu.direction")
	attrECCType   = attribute.Key("shizu.ecc.type")
	attrVerb      = attribute.Key("shizu.command")
	attrOutcome   = attribute.Key("shizu.outcome")
	attrReason    = attribute.Key("shizu.exit_reason")
	attrWhat      = attribute.Key("shizu.report")
)

type metrics struct {
	util, vram, temp, power, ecc, pcie, nvlink metric.Int64Gauge
	commands                                   metric.Int64Counter
	stopped                                    metric.Int64Counter
	refused                                    metric.Int64Counter
	logLines                                   metric.Int64Counter
	sampleDur                                  metric.Float64Histogram
	gpuAttrs                                   []metric.MeasurementOption
}

func newMetrics(m metric.Meter, running func() int64) (*metrics, error) {
	var (
		x   metrics
		err error
		all []error
	)
	gauge := func(name, unit, desc string) metric.Int64Gauge {
		g, e := m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		all = append(all, e)
		return g
	}
	x.util = gauge("shizu.gpu.utilization", "%", "GPU utilization, percent of the sample period a kernel ran")
	x.vram = gauge("shizu.gpu.memory.used", "MiBy", "GPU memory in use")
	x.temp = gauge("shizu.gpu.temperature", "Cel", "GPU core temperature")
	x.power = gauge("shizu.gpu.power", "mW", "GPU power draw")
	x.ecc = gauge("shizu.gpu.ecc.errors", "{error}", "ECC errors since the driver loaded (volatile)")
	x.pcie = gauge("shizu.gpu.pcie.throughput", "By/s", "PCIe throughput")
	x.nvlink = gauge("shizu.gpu.nvlink.throughput", "By/s", "NVLink throughput summed over links")
	x.commands, err = m.Int64Counter("shizu.agent.commands", metric.WithDescription("agent commands handled, by verb and outcome"))
	all = append(all, err)
	x.stopped, err = m.Int64Counter("shizu.agent.workloads.stopped", metric.WithDescription("workloads that ended, by exit reason"))
	all = append(all, err)
	x.refused, err = m.Int64Counter("shizu.agent.reports.refused",
		metric.WithDescription("reports the bus refused for good (invalid or not permitted), not retried, by report"))
	all = append(all, err)
	x.logLines, err = m.Int64Counter("shizu.agent.logs.lines", metric.WithUnit("{line}"),
		metric.WithDescription("workload output lines, by outcome: shipped, truncated (shipped cut at the line cap), dropped (over the rate limit or refused)"))
	all = append(all, err)
	x.sampleDur, err = m.Float64Histogram("shizu.agent.telemetry.sample.duration", metric.WithUnit("s"),
		metric.WithDescription("time to sample every GPU once"))
	all = append(all, err)
	_, err = m.Int64ObservableGauge("shizu.agent.workloads.running", metric.WithDescription("workloads running on this node"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(running())
			return nil
		}))
	all = append(all, err)
	for _, e := range all {
		if e != nil {
			return nil, e
		}
	}
	return &x, nil
}

func (m *metrics) setGPUs(devs []gpu.Device) {
	m.gpuAttrs = make([]metric.MeasurementOption, len(devs))
	for i, d := range devs {
		m.gpuAttrs[i] = metric.WithAttributeSet(attribute.NewSet(attrGPU.Int(i), attrModel.String(d.Model)))
	}
}

var (
	dirRx        = attribute.NewSet(attrDirection.String("rx"))
	dirTx        = attribute.NewSet(attrDirection.String("tx"))
	eccCorrected = attribute.NewSet(attrECCType.String("corrected"))
	eccUncorr    = attribute.NewSet(attrECCType.String("uncorrected"))
	logShipped   = attribute.NewSet(attrOutcome.String("shipped"))
	logTruncated = attribute.NewSet(attrOutcome.String("truncated"))
	logDropped   = attribute.NewSet(attrOutcome.String("dropped"))
)

func (m *metrics) record(ctx context.Context, samples []gpu.Sample) {
	for _, s := range samples {
		if s.Index >= len(m.gpuAttrs) || s.Lost {
			continue
		}
		a := m.gpuAttrs[s.Index]
		m.util.Record(ctx, int64(s.UtilizationPercent), a)
		m.vram.Record(ctx, s.VRAMUsedMiB, a)
		m.temp.Record(ctx, int64(s.TemperatureC), a)
		m.power.Record(ctx, s.PowerMW, a)
		m.ecc.Record(ctx, s.ECCCorrected, a, metric.WithAttributeSet(eccCorrected))
		m.ecc.Record(ctx, s.ECCUncorrected, a, metric.WithAttributeSet(eccUncorr))
		m.pcie.Record(ctx, s.PCIeRxBytesPerSec, a, metric.WithAttributeSet(dirRx))
		m.pcie.Record(ctx, s.PCIeTxBytesPerSec, a, metric.WithAttributeSet(dirTx))
		m.nvlink.Record(ctx, s.NVLinkRxBytesPerSec, a, metric.WithAttributeSet(dirRx))
		m.nvlink.Record(ctx, s.NVLinkTxBytesPerSec, a, metric.WithAttributeSet(dirTx))
	}
}
