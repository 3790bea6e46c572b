package capacity

import (
	"context"
	"time"
)

// ReleaseLiveOn runs Release's script on node as if the caller had found
// the rental there in the index: the step of Release that a concurrent
// hand-over can overtake.
func (s *Store) ReleaseLiveOn(ctx context.Context, rentalID, nodeID string) ([]any, error) {
	return s.run(ctx, "release "+rentalID, releaseScript,
		[]string{s.keys.node(nodeID), s.keys.allocs(nodeID), s.keys.rentals(), s.keys.version(), s.keys.usage()},
		rentalID, nodeID, "live")
}

// WithSnapshotBatch sets how many nodes Snapshot reads per round trip
// (default DefaultSnapshotBatch), so tests reach the batch boundaries with
// a few nodes and the benchmark compares batch sizes. Each batch is one
// MULTI/EXEC, atomic, holding Redis for its duration.
func WithSnapshotBatch(n int) Option { return func(c *config) { c.batch = n } }

// WithClock sets the clock that stamps Allocation.CreatedAt (default
// time.Now).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }
