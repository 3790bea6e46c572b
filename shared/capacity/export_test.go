package capacity

import "context"

// ReleaseLiveOn runs Release's script on node as if the caller had found
// the rental there in the index: the step of Release that a concurrent
// hand-over can overtake.
func (s *Store) ReleaseLiveOn(ctx context.Context, rentalID, nodeID string) ([]any, error) {
	return s.run(ctx, "release "+rentalID, releaseScript,
		[]string{s.keys.node(nodeID), s.keys.allocs(nodeID), s.keys.rentals(), s.keys.version()},
		rentalID, nodeID, "live")
}
