package app

import (
	"context"
	"hash/fnv"
	"log/slog"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
)

// SimulatedProfiles names the simulated GPU hosts -simulate accepts
// (h100x8, a100x8, ...), in a stable order.
func SimulatedProfiles() []string { return simgpu.Profiles() }

// checkProfile says whether profile names a simulated host.
func checkProfile(profile string) error {
	_, err := simgpu.Lookup(profile)
	return err
}

// SimulatedHost is one node's simulated GPUs, for a caller that runs the
// agent in its own process (`shizu dev`, tests) and breaks its hardware:
// pass it in Config.Simulated and inject faults with its methods, which
// the running agent then sees as it would from NVML and its provider.
type SimulatedHost struct {
	fleet *simgpu.Fleet
}

// NewSimulatedHost builds the simulated GPUs of profile for node, seeded
// by the node id as an agent given -simulate seeds them, so a node
// restarted on a new SimulatedHost shows the same GPUs (UUIDs).
func NewSimulatedHost(profile, node string) (*SimulatedHost, error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	f, err := simgpu.New(profile, h.Sum64())
	if err != nil {
		return nil, err
	}
	return &SimulatedHost{fleet: f}, nil
}

// RaiseXID makes GPU i report Xid xid (79 also takes it off the bus).
func (h *SimulatedHost) RaiseXID(i, xid int) error { return h.fleet.RaiseXID(i, xid) }

// InjectECC adds corrected and uncorrected ECC errors to GPU i (an
// uncorrected one is reported with Xid 48); a profile without ECC memory
// refuses.
func (h *SimulatedHost) InjectECC(i int, corrected, uncorrected uint64) error {
	return h.fleet.InjectECC(i, corrected, uncorrected)
}

// FallOffBus makes GPU i stop answering, with Xid 79.
func (h *SimulatedHost) FallOffBus(i int) error { return h.fleet.FallOffBus(i) }

// NoticeInterruption delivers a spot interruption notice with deadline to
// the agent, as the provider would; it waits, within ctx, for the agent
// to take it.
func (h *SimulatedHost) NoticeInterruption(ctx context.Context, deadline time.Time, reason string) error {
	return h.fleet.NoticeInterruption(ctx, deadline, reason)
}

// backend is the GPU backend the agent runs on, with what a simulated
// profile says of the host.
type backend struct {
	host gpu.Host
	load gpu.LoadModel // nil on real GPUs
	// cpuMilli, memMiB and instanceType are the simulated profile's (zero
	// on real GPUs: the host's own are used); simulated names the profile.
	cpuMilli, memMiB        int64
	instanceType, simulated string
}

// openBackend returns the GPU backend: the injected or named simulated
// host (whose load then follows the workloads, and which with
// SimulateNoticeLead turns SIGUSR1 into spot notices until the host is
// closed), else real NVML (which refuses to start without a driver).
func (c Config) openBackend(log *slog.Logger) (backend, error) {
	sim := c.Simulated
	if sim == nil && c.Simulate != "" {
		var err error
		if sim, err = NewSimulatedHost(c.Simulate, c.NodeID); err != nil {
			return backend{}, err
		}
	}
	if sim == nil {
		h, err := nvmlgpu.New(nvml.New(), nvmlgpu.WithClock(c.clock()))
		return backend{host: h}, err
	}
	fleet := sim.fleet
	h, err := fleet.Host(nvmlgpu.WithClock(c.clock()))
	if err != nil {
		return backend{}, err
	}
	p := fleet.Profile
	b := backend{host: h, load: fleet, cpuMilli: p.CPUMilli, memMiB: p.MemoryMiB, instanceType: p.InstanceType, simulated: p.Name}
	if c.SimulateNoticeLead > 0 {
		stop := fleet.NoticeOnSignal(c.SimulateNoticeLead, c.clock(), log, syscall.SIGUSR1)
		b.host = closedWith{Host: h, also: stop}
	}
	return b, nil
}

// closedWith is a Host whose Close also ends what came with it.
type closedWith struct {
	gpu.Host
	also func()
}

func (h closedWith) Close() error {
	h.also()
	return h.Host.Close()
}
