// Package gpu describes what a node agent learns about its GPUs: the
// inventory found at start (devices, MIG instances, NVLink topology,
// confidential-computing state), periodic telemetry samples, and health
// events (Xid errors, ECC errors, a GPU lost). A Host is one backend that
// reads them: the real one over NVML (gpu/nvmlgpu) or a simulated fleet
// (gpu/simgpu) that runs the same NVML code over go-nvml's mocks.
//
// This package holds only types and pure functions; it does not import
// NVML, so it builds without cgo.
package gpu

import (
	"context"
	"errors"
	"time"
)

// ErrNoDriver means NVML could not be loaded: the host has no NVIDIA driver
// (or no GPU). The agent refuses to start on it unless a simulated profile
// is asked for.
var ErrNoDriver = errors.New("NVIDIA driver (libnvidia-ml.so.1) not found: this host cannot report real GPUs; run with -simulate <profile> for a simulated fleet")

// Inventory is everything discovered about a host's GPUs.
type Inventory struct {
	DriverVersion     string
	CUDADriverVersion int // e.g. 12040 for CUDA 12.4
	// TEE is the confidential-computing state of the system.
	TEE     TEEState
	Devices []Device // Devices[i].Index == i
	// NVLinkDomains groups device indexes that all reach each other over
	// NVLink (through NVSwitches or direct links); sorted, each at least two
	// GPUs, a GPU in at most one domain.
	NVLinkDomains [][]int
}

// TEEState is the system's confidential-computing (CC) state.
type TEEState struct {
	// Supported is true when the driver exposes a CC environment (the CPU
	// and GPU can run confidential VMs).
	Supported bool
	// Enabled is true when CC mode is on, so rentals can run in a TEE.
	Enabled bool
	// Environment is "unavailable", "sim" or "prod".
	Environment string
}

// Device is one physical GPU.
type Device struct {
	Index       int
	UUID        string
	ProductName string // as NVML reports it, e.g. "NVIDIA H100 80GB HBM3"
	// Model is the normalized model token (ModelToken), e.g. "H100-SXM5-80GB".
	Model             string
	VRAMMiB           int64
	PCIBusID          string // normalized by NormalizeBusID
	Architecture      string // e.g. "hopper"
	ComputeCapability string // e.g. "9.0"
	MIGCapable        bool
	MIGEnabled        bool
	MIG               []MIGInstance
	NVLinks           []NVLink // active links only
	// NVLinkPeers are the indexes of the GPUs this one reaches over NVLink
	// (directly or through an NVSwitch), sorted; filled by Link.
	NVLinkPeers  []int
	Capabilities []string
}

// NVLink is one active NVLink of a device.
type NVLink struct {
	Link        int
	RemoteBusID string // normalized PCI bus id of the far end
	// RemoteIsSwitch is true when the far end is an NVSwitch rather than a GPU.
	RemoteIsSwitch bool
}

// MIGInstance is one MIG device (a GPU instance with a compute instance).
type MIGInstance struct {
	UUID              string
	Profile           string // e.g. "1g.10gb"
	GPUInstanceID     int
	ComputeInstanceID int
	VRAMMiB           int64
}

// Sample is one telemetry reading of one GPU.
type Sample struct {
	Index               int
	UtilizationPercent  int
	VRAMUsedMiB         int64
	TemperatureC        int
	PowerMW             int64
	ECCCorrected        int64 // volatile counters since the driver loaded
	ECCUncorrected      int64
	PCIeRxBytesPerSec   int64
	PCIeTxBytesPerSec   int64
	NVLinkRxBytesPerSec int64
	NVLinkTxBytesPerSec int64
	// Lost is true when the GPU no longer answers (fell off the bus).
	Lost bool
}

// EventKind is what a health event reports.
type EventKind int

// Event kinds.
const (
	EventXID EventKind = iota + 1
	EventECCCorrected
	EventECCUncorrected
	EventLost
)

func (k EventKind) String() string {
	switch k {
	case EventXID:
		return "xid"
	case EventECCCorrected:
		return "ecc_corrected"
	case EventECCUncorrected:
		return "ecc_uncorrected"
	case EventLost:
		return "gpu_lost"
	}
	return "unknown"
}

// Event is one health event of one GPU, as the driver reported it.
type Event struct {
	Index int
	Kind  EventKind
	XID   int // for EventXID (and the Xid the driver attached to ECC events)
	At    time.Time
}

// Notice is a provider's announcement that it will reclaim the host (a spot
// interruption).
type Notice struct {
	Deadline time.Time
	Reason   string
}

// Host reads one machine's GPUs.
type Host interface {
	// Discover reads the inventory.
	Discover(ctx context.Context) (Inventory, error)
	// Sample appends one telemetry reading per GPU to into and returns it.
	// A GPU that stopped answering yields a Sample with Lost set.
	Sample(ctx context.Context, into []Sample) ([]Sample, error)
	// Watch sends health events to out until ctx ends.
	Watch(ctx context.Context, out chan<- Event) error
	// Notices delivers provider interruption notices; nil when the host has
	// no notice source (NVML on a real host has none; a simulated fleet's
	// come from NoticeInterruption and NoticeOnSignal).
	Notices() <-chan Notice
	// Close releases the driver.
	Close() error
}

// LoadModel is implemented by simulated hosts, whose telemetry follows the
// work the agent runs on them: AddLoad adds (or, negative, removes) a share
// of a GPU, in milli-GPU, by GPU or MIG UUID.
type LoadModel interface {
	AddLoad(uuid string, milli int)
}
