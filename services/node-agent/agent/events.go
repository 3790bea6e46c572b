package agent

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

// MaxStopMessage is the most bytes of a RentalStopped message (the
// workload's last log line or why it could not start).
const MaxStopMessage = 1024

// DetailRefused is the message of a RentalStopped reported again after the
// bus refused it for good with the workload's own detail.
const DetailRefused = "(the workload's last output could not be reported)"

// Events builds the events the agent of one node publishes, with their
// ids: an id names what happened, so a repeated publish of the same fact
// is stored once.
type Events struct {
	NodeID string
	Source string // the agent as EventMeta.source, e.g. "node-agent/gpu-1"
}

// Registered is desc (from Describe) registered at epoch, announced at at.
// desc is not changed.
func (e Events) Registered(desc *shizuv1.NodeRegistered, epoch int64, at time.Time) *shizuv1.NodeRegistered {
	ev := proto.Clone(desc).(*shizuv1.NodeRegistered)
	ev.Epoch = epoch
	ev.Meta = shizuv1.NewMeta(fmt.Sprintf("node:%s:registered:%d", e.NodeID, epoch), e.Source, "", e.NodeID, at)
	return ev
}

// Started announces that r's workload runs, caused by the command
// causation (empty when none).
func (e Events) Started(r Rental, causation string) *shizuv1.RentalStarted {
	return &shizuv1.RentalStarted{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:started:%d", r.RentalID, r.Attempt), e.Source, causation, r.RentalID, r.StartedAt),
		RentalId: r.RentalID, TenantId: r.TenantID, NodeId: e.NodeID, NodeEpoch: r.Epoch,
		StartedAt: timestamppb.New(r.StartedAt), GpuUuids: r.GPUUUIDs, Attempt: r.Attempt,
	}
}

// Stopped announces how r's workload ended. The message is cut to
// MaxStopMessage bytes on a rune boundary, so the event always encodes.
func (e Events) Stopped(r Rental, o Outcome, causation string) *shizuv1.RentalStopped {
	return &shizuv1.RentalStopped{
		Meta:     shizuv1.NewMeta(fmt.Sprintf("rental:%s:stopped:%d", r.RentalID, r.Attempt), e.Source, causation, r.RentalID, o.StoppedAt),
		RentalId: r.RentalID, TenantId: r.TenantID, NodeId: e.NodeID, NodeEpoch: r.Epoch,
		StartedAt: timestamppb.New(r.StartedAt), StoppedAt: timestamppb.New(o.StoppedAt), ExitReason: o.Reason,
		ExitCode: o.ExitCode, Message: shizuv1.Truncate(o.Message, MaxStopMessage), Attempt: r.Attempt,
	}
}

// Interruption announces a provider's interruption notice received at at
// while the node was at epoch. The provider's reason is cut like a stop
// message (and made valid UTF-8), so the event always encodes.
func (e Events) Interruption(epoch int64, n gpu.Notice, at time.Time) *shizuv1.NodeInterruptionNoticed {
	return &shizuv1.NodeInterruptionNoticed{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("node:%s:interruption:%d", e.NodeID, epoch), e.Source, "", e.NodeID, at),
		NodeId: e.NodeID, Epoch: epoch, Deadline: timestamppb.New(n.Deadline), Reason: shizuv1.Truncate(n.Reason, MaxStopMessage),
	}
}

// Drained announces that the drain d of the node at epoch is complete.
func (e Events) Drained(epoch int64, d Drain, at time.Time) *shizuv1.NodeDrained {
	return &shizuv1.NodeDrained{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("node:%s:drained:%d", e.NodeID, epoch), e.Source, "", e.NodeID, at),
		NodeId: e.NodeID, Epoch: epoch, DrainStartedAt: timestamppb.New(d.StartedAt), Reason: d.Reason,
	}
}

// HealthChanged announces one health change of the node at epoch.
func (e Events) HealthChanged(epoch int64, c HealthChange, at time.Time) *shizuv1.NodeHealthChanged {
	return &shizuv1.NodeHealthChanged{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("node:%s:health:%d:%d:%s", e.NodeID, epoch, c.Index, c.Now), e.Source, "", e.NodeID, at),
		NodeId: e.NodeID, Epoch: epoch, GpuIndex: int32(c.Index), PreviousHealth: c.Previous, Health: c.Now,
		Xid: int32(c.XID), EccCorrected: c.ECCCorrected, EccUncorrected: c.ECCUncorrected, Reason: c.Reason,
	}
}

// Telemetry is one NodeTelemetry of samples taken at at; lost GPUs are
// left out (their health change says why).
func (e Events) Telemetry(epoch int64, at time.Time, samples []gpu.Sample) *shizuv1.NodeTelemetry {
	ev := &shizuv1.NodeTelemetry{
		Meta:   shizuv1.NewMeta(fmt.Sprintf("node:%s:telemetry:%d:%d", e.NodeID, epoch, at.UnixMilli()), e.Source, "", e.NodeID, at),
		NodeId: e.NodeID, Epoch: epoch, Gpus: make([]*shizuv1.GpuTelemetry, 0, len(samples)),
	}
	for _, s := range samples {
		if s.Lost {
			continue
		}
		ev.Gpus = append(ev.Gpus, &shizuv1.GpuTelemetry{GpuIndex: int32(s.Index), UtilizationPercent: int32(s.UtilizationPercent),
			VramUsedMib: s.VRAMUsedMiB, TemperatureC: int32(s.TemperatureC), PowerMw: s.PowerMW,
			EccCorrected: s.ECCCorrected, EccUncorrected: s.ECCUncorrected,
			PcieRxBytesPerSecond: s.PCIeRxBytesPerSec, PcieTxBytesPerSecond: s.PCIeTxBytesPerSec,
			NvlinkRxBytesPerSecond: s.NVLinkRxBytesPerSec, NvlinkTxBytesPerSecond: s.NVLinkTxBytesPerSec})
	}
	return ev
}
