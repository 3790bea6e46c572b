package capacity

import (
	"time"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// MilliPerGPU is the capacity of one GPU in milli-GPU.
const MilliPerGPU = 1000

// MaxMIGInstances is the most MIG instances one GPU can have (seven
// compute slices).
const MaxMIGInstances = 7

// DefaultMaxSharers is the number of allocations one GPU may hold at once
// when GPU.MaxSharers is 0.
const DefaultMaxSharers = 4

// Market is how a node's GPUs are sold (Shizu's one market vocabulary,
// shared/rent).
type Market = rent.Market

// Markets.
const (
	MarketOnDemand = rent.OnDemand
	MarketSpot     = rent.Spot
)

// NodeStatus is whether a node takes new work.
type NodeStatus string

// Node statuses. Only Ready nodes take new reservations. Draining is set by
// an operator (SetStatus); Dead only by Fence, and only Register brings a dead
// node back.
const (
	StatusReady    NodeStatus = "ready"
	StatusDraining NodeStatus = "draining"
	StatusDead     NodeStatus = "dead"
)

// Node is the static description of a GPU host, as its node agent registers it.
type Node struct {
	ID                    string
	Zone                  string
	Market                Market
	PricePerGPUHourMicros int64 // micro-units of Currency per GPU-hour
	Currency              string
	TEECapable            bool
	CPUMilli              int64 // host CPU that rentals may use, milli-cores
	MemoryMiB             int64 // host memory that rentals may use
	// GPUs lists every GPU, GPUs[i].Index == i.
	GPUs []GPU
	// NVLinkDomains groups GPU indexes that share an NVLink fabric; a GPU is
	// in at most one domain.
	NVLinkDomains [][]int
	Labels        map[string]string
}

// GPU is one device of a node.
type GPU struct {
	Index       int
	UUID        string
	Model       string
	VRAMMiB     int64
	MIGCapable  bool
	NVLinkPeers []int
	// MaxSharers is how many allocations may share this GPU at once;
	// 0 means DefaultMaxSharers. Ignored in MIG mode.
	MaxSharers int
	// MIGEnabled: the GPU is in MIG mode. It then takes only MIG shares,
	// each on one free instance of MIGInstances (so as many allocations as
	// it has instances), and no whole-GPU or time-shared one.
	MIGEnabled   bool
	MIGInstances []MIGInstance
}

// MIGInstance is one configured MIG instance of a GPU in MIG mode.
type MIGInstance struct {
	UUID    string // as NVML reports it, e.g. "MIG-4a1f5c3e-..."
	Profile string // e.g. "1g.10gb"
	VRAMMiB int64
}

// EffectiveMaxSharers is how many allocations the GPU may hold at once:
// MaxSharers with the default applied, or in MIG mode its instance count.
func (g GPU) EffectiveMaxSharers() int {
	if g.MIGEnabled {
		return len(g.MIGInstances)
	}
	if g.MaxSharers == 0 {
		return DefaultMaxSharers
	}
	return g.MaxSharers
}

// GPUShare is the part of one GPU a placement takes.
type GPUShare struct {
	Index   int
	Milli   int64 // 1..MilliPerGPU
	VRAMMiB int64
	// MIGProfile names the MIG slice (e.g. "1g.10gb"); empty for a
	// time-shared or whole GPU. A MIG share needs a GPU in MIG mode and
	// names in MIGInstance the UUID of a free instance of that profile.
	MIGProfile  string
	MIGInstance string
}

// Placement is what a scheduler asks to commit: a rental on one node, under
// the node epoch the scheduler saw.
type Placement struct {
	RentalID  string
	NodeID    string
	Epoch     uint64
	Tenant    string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      []GPUShare
	// Attempt is the rental's placement attempt (1 for its first
	// placement, one more for each re-placement); 0 when the caller did
	// not say. Restore keeps the higher attempt when two nodes hold the
	// same rental.
	Attempt int32
	// Quota, when set, is the tenant's limits: Reserve refuses the
	// placement (*QuotaError) when it would take the tenant past them
	// (quota.go). Nil: no limit. It is not stored.
	Quota *Quota
}

// Allocation is a placement as the store recorded it.
type Allocation struct {
	Placement
	CreatedAt time.Time
	// Existing is true when Reserve found this rental already recorded and
	// returned the earlier allocation instead of writing a new one. It is
	// not stored.
	Existing bool
	// HandingOver is true for a rental's previous run kept on its node
	// while the rental's next attempt is placed and started elsewhere
	// (Store.HandOver): it still holds its capacity and renews, but the
	// rental index no longer points to it. Store.ReleaseOn frees it.
	HandingOver bool
}

// FreeGPU is the live state of one GPU.
type FreeGPU struct {
	Index      int
	Milli      int64 // free milli-GPU
	VRAMMiB    int64 // free VRAM
	Sharers    int   // allocations using this GPU
	MaxSharers int   // effective sharer limit
	// FreeMIGInstances are the UUIDs of the GPU's MIG instances that no
	// allocation holds, sorted (empty unless the GPU is in MIG mode).
	FreeMIGInstances []string
	// Health is the GPU's last reported health (SetGPUHealth), empty when
	// none but healthy was reported; only a healthy GPU takes new
	// reservations.
	Health GPUHealth
}

// Healthy reports whether the GPU takes new reservations.
func (g FreeGPU) Healthy() bool { return g.Health == "" || g.Health == HealthHealthy }

// NodeState is a node as stored: its static facts, status, epoch, what is
// free and what is allocated.
type NodeState struct {
	Node
	Status        NodeStatus
	Epoch         uint64
	FreeCPUMilli  int64
	FreeMemoryMiB int64
	FreeGPUs      []FreeGPU    // FreeGPUs[i] is GPU i
	Allocations   []Allocation // sorted by RentalID
}

// Snapshot is every node of the store. Version is the store-wide mutation
// counter read before any node was read: if Store.Version still returns the
// same number, nothing has changed since and the snapshot is exact; if it is
// higher, the snapshot may be stale (or, when taken in several batches,
// torn between nodes; each node on its own is always read atomically).
type Snapshot struct {
	Version uint64
	Nodes   []NodeState // sorted by ID
}

// FenceResult is what Fence did: the node's new epoch and the allocations it
// held, which the caller now has to move.
type FenceResult struct {
	Epoch       uint64
	Allocations []Allocation // sorted by RentalID
}
