package agent

import (
	"fmt"
	"slices"
	"strings"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// A capacity store that comes back empty (Redis restarted without its
// data) has lost every allocation, but not the workloads: they still run
// and their placements are still decided (JetStream holds them). The agent
// tells the loss from a release by the store's generation, and then
// restores its node with the allocations of what it runs instead of
// stopping it all as zombies (Reconcile).

// StoreLost reports whether the store the agent registered in is gone:
// known is the generation the agent registered in ("" before it ever
// registered in one), current the store's now ("" when it has none).
func StoreLost(known, current string) bool {
	return known != "" && current != known
}

// RestoreEpoch is the epoch a lost node is restored at: the highest the
// agent knows of, its own or a running workload's (an agent restarted
// after the loss knows only what its state directory kept). Fencing
// tokens never go back.
func RestoreEpoch(epoch int64, running []Rental) int64 {
	for _, r := range running {
		epoch = max(epoch, r.Epoch)
	}
	return max(epoch, 1)
}

// Restorable splits the running workloads for a restore at epoch: those
// placed under epoch are restored; one placed under an older epoch kept
// running after its node was fenced (the store then lost the fence too),
// and stops as Reconcile would stop it.
func Restorable(epoch int64, running []Rental) (keep []Rental, stops []Stop) {
	for _, r := range running {
		if r.Epoch == epoch {
			keep = append(keep, r)
			continue
		}
		stops = append(stops, Stop{Rental: r, Reason: shizuv1.ExitReason_EXIT_REASON_NODE_FAILED,
			Message: fmt.Sprintf("node was fenced while the rental ran (placed at epoch %d, the node is at %d); the rental moves elsewhere", r.Epoch, epoch)})
	}
	sortStops(stops)
	return keep, stops
}

// Lost is a rental the restore found on another node, under the same or
// a later attempt.
type Lost struct {
	RentalID string
	NodeID   string
	Attempt  int32
}

// LostStops are the stops of the running workloads whose rental another
// node holds: the rental was moved, and this run is a zombie of an
// earlier attempt.
func LostStops(running []Rental, lost []Lost) []Stop {
	byID := map[string]Lost{}
	for _, l := range lost {
		byID[l.RentalID] = l
	}
	var stops []Stop
	for _, r := range running {
		if l, ok := byID[r.RentalID]; ok {
			stops = append(stops, Stop{Rental: r, Reason: shizuv1.ExitReason_EXIT_REASON_NODE_FAILED,
				Message: fmt.Sprintf("the rental runs as attempt %d on node %s; this run (attempt %d) ends", l.Attempt, l.NodeID, r.Attempt)})
		}
	}
	sortStops(stops)
	return stops
}

func sortStops(stops []Stop) {
	slices.SortFunc(stops, func(a, b Stop) int { return strings.Compare(a.Rental.RentalID, b.Rental.RentalID) })
}
