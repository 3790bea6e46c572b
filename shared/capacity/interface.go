package capacity

import "context"

// Interface is what a capacity store does: the methods the services call.
// *Store keeps the state in Redis (atomic Lua scripts, shared by every
// replica); memstore.Store keeps it in memory, for tests and tools of one
// process. Both pass the contract suite in capacitytest. Each service
// depends on the narrow part of it that it uses.
type Interface interface {
	Register(ctx context.Context, n Node) (uint64, error)
	Join(ctx context.Context, n Node) (Registration, error)
	Restore(ctx context.Context, in RestoreInput) (RestoreResult, error)
	Generation(ctx context.Context) (string, error)
	Reserve(ctx context.Context, p Placement) (Allocation, error)
	ReserveMany(ctx context.Context, ps []Placement) []ReserveResult
	Release(ctx context.Context, rentalID string) (bool, error)
	ReleaseOn(ctx context.Context, nodeID string, rentalIDs ...string) ([]bool, error)
	ReleaseHandedOver(ctx context.Context, nodeID string, rentalIDs ...string) ([]bool, error)
	HandOver(ctx context.Context, rentalID, nodeID string) (Allocation, error)
	Renew(ctx context.Context, rentalID, nodeID string, epoch uint64) error
	Fence(ctx context.Context, nodeID string, expectedEpoch uint64) (FenceResult, error)
	SetStatus(ctx context.Context, nodeID string, status NodeStatus, expectedEpoch uint64) error
	SetGPUHealth(ctx context.Context, nodeID string, epoch uint64, gpu int, h GPUHealth) (bool, error)
	Remove(ctx context.Context, nodeID string) error
	Node(ctx context.Context, nodeID string) (NodeState, error)
	Allocations(ctx context.Context, nodeID string) ([]Allocation, error)
	Allocation(ctx context.Context, rentalID string) (Allocation, error)
	Version(ctx context.Context) (uint64, error)
	Snapshot(ctx context.Context) (Snapshot, error)
	Usage(ctx context.Context, tenant string) (Usage, error)
}

var _ Interface = (*Store)(nil)
