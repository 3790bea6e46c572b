package migrate

import (
	"encoding/json"
	"slices"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Modes of a move.
const (
	// ModeBreak: the old run is gone (or stopped first); the allocation is
	// released before the scheduler hears of the move.
	ModeBreak = "break"
	// ModeMakeBeforeBreak: the old run goes on until the replacement
	// started; the old allocation is handed over (out of the rental index)
	// so the scheduler can reserve the next attempt beside it.
	ModeMakeBeforeBreak = "make-before-break"
)

// Record is a move in flight, from the decision to RentalMigrated, as
// failover records it (JSON).
type Record struct {
	Rental      string    `json:"rental"`
	Tenant      string    `json:"tenant"`
	FromNode    string    `json:"from_node"`
	FromEpoch   uint64    `json:"from_epoch"`
	FromAttempt int32     `json:"from_attempt"`
	NextAttempt int32     `json:"next_attempt"`
	GPUs        []int     `json:"gpus,omitempty"`
	Reason      int32     `json:"reason"` // shizuv1.MigrationReason
	Mode        string    `json:"mode"`
	StopOld     bool      `json:"stop_old,omitempty"` // tell the old node's agent to stop the run
	LastAlive   time.Time `json:"last_alive,omitzero"`
	LastBeat    time.Time `json:"last_beat,omitzero"`
	DecidedAt   time.Time `json:"decided_at"`
	Cause       string    `json:"cause"` // event id that caused it
	Published   bool      `json:"published,omitempty"`
	Scheduled   bool      `json:"scheduled,omitempty"` // fence-to-scheduled measured
	// Failed says why the move can never be handed over (invalid input);
	// the sweep leaves it alone and the rental stays on its old node.
	Failed string `json:"failed,omitempty"`
	// Class is stored as its storm rank (see MarshalJSON).
	Class    Class `json:"class"`
	Priority int   `json:"priority"`
}

// storedRanks are the classes by the rank a record stores ("class"):
// replicas recorded the storm rank, 0 first, before classes became
// rent.Class (which counts the other way), and records outlive replicas.
var storedRanks = [...]Class{ClassReserved, ClassOnDemand, ClassSpot, ClassUnknown}

// MarshalJSON writes the record with its class as the storm rank, so
// replicas of every version read each other's records the same.
func (r Record) MarshalJSON() ([]byte, error) {
	type fields Record // without the methods
	rank := slices.Index(storedRanks[:], r.Class)
	if rank < 0 {
		rank = len(storedRanks) - 1
	}
	return json.Marshal(struct {
		fields
		Class int `json:"class"`
	}{fields(r), rank})
}

// UnmarshalJSON reads a record written by MarshalJSON; a rank it does not
// know is ClassUnknown (moved last).
func (r *Record) UnmarshalJSON(data []byte) error {
	type fields Record // without the methods
	v := struct {
		*fields
		Class int `json:"class"`
	}{fields: (*fields)(r)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	r.Class = ClassUnknown
	if v.Class >= 0 && v.Class < len(storedRanks) {
		r.Class = storedRanks[v.Class]
	}
	return nil
}

// Move is the record as the queue orders it.
func (r Record) Move() Move {
	return Move{Rental: r.Rental, Tenant: r.Tenant, Node: r.FromNode, GPUs: r.GPUs,
		Class: r.Class, Priority: r.Priority, Since: r.DecidedAt, Value: r}
}

// Placement is what failover knows of a rental's latest placement (from
// RentalScheduled): the attempt a move re-queues, and the spec, the same
// for every attempt.
type Placement struct {
	Attempt int32
	Tenant  string
	Node    string
	Spec    *shizuv1.RentalSpec
	// Model and VRAMMiB (per GPU) of the GPUs it was given
	// (RentalScheduled.gpu_model and gpus); see ReplacementSpec.
	Model   string
	VRAMMiB int64
}

// Allocation is a rental's allocation on the node a failure moves it off.
type Allocation struct {
	Rental string
	Tenant string
	// GPUs are the indexes of the node's GPUs it holds.
	GPUs []int
	// HandingOver: the old run of a make-before-break move, handed over
	// already.
	HandingOver bool
}

// Order is what the moves of one failure share.
type Order struct {
	Node    string
	Epoch   uint64
	Reason  int32 // shizuv1.MigrationReason
	Mode    string
	StopOld bool
	// LastAlive is the last sign of life of the old runs (the downtime
	// starts there), LastBeat the node's last heartbeat; zero when the
	// runs are still alive (make-before-break).
	LastAlive time.Time
	LastBeat  time.Time
	Decided   time.Time
	// Cause is the id of the event the failure was decided on.
	Cause string
}

// Plan is what a failure's moves commit.
type Plan struct {
	// Moves are recorded and queued.
	Moves []Record
	// Revised are recorded moves whose downtime start is now known: the
	// old run of a make-before-break move died before the new one started.
	Revised []Record
	// Release are the rentals whose allocation on the order's node was
	// handed over already (the old run of a make-before-break move): on a
	// lost node it is released, the rental's next attempt being placed
	// elsewhere.
	Release []string
}

// PlanMoves reconciles a failure's allocations with what failover knows of
// each rental: its latest placement (placements; a rental never seen
// scheduled moves last, with attempt 0) and the move recorded for it
// already (prevs). An allocation handed over already is no move (a
// redelivered notice; on a lost node it is released); an allocation of a
// rental moved here off another node before its RentalScheduled arrived is
// that newer attempt; a move recorded already for the same next attempt
// keeps its decision time, and is not planned again by a make-before-break
// order (it is under way).
func PlanMoves(allocs []Allocation, placements map[string]Placement, prevs map[string]Record, o Order) Plan {
	var p Plan
	for _, a := range allocs {
		prev, moving := prevs[a.Rental]
		if a.HandingOver {
			if o.Mode != ModeBreak {
				continue // handed over before (a redelivered notice)
			}
			p.Release = append(p.Release, a.Rental)
			if moving && prev.FromNode == o.Node && prev.LastAlive.IsZero() && !o.LastAlive.IsZero() {
				// The old run died before the new one started: the
				// downtime runs from its last sign of life.
				prev.LastAlive, prev.LastBeat = o.LastAlive, o.LastBeat
				p.Revised = append(p.Revised, prev)
			}
			continue
		}
		m := Record{
			Rental: a.Rental, Tenant: a.Tenant, FromNode: o.Node, FromEpoch: o.Epoch,
			Reason: o.Reason, Mode: o.Mode, StopOld: o.StopOld, LastAlive: o.LastAlive, LastBeat: o.LastBeat,
			DecidedAt: o.Decided, Cause: o.Cause, Class: ClassUnknown, GPUs: a.GPUs,
		}
		if pl, known := placements[a.Rental]; known {
			m.FromAttempt, m.NextAttempt = pl.Attempt, pl.Attempt+1
			m.Class, m.Priority = rent.ClassOf(pl.Spec.GetPlan()), int(pl.Spec.GetPriority())
		}
		if moving && prev.FromNode != o.Node && prev.NextAttempt > m.FromAttempt {
			// The rental was already moved off another node and placed
			// here as prev.NextAttempt before failover read that
			// RentalScheduled: the allocation here is that newer attempt.
			m.FromAttempt, m.NextAttempt = prev.NextAttempt, prev.NextAttempt+1
		}
		if moving && prev.NextAttempt == m.NextAttempt {
			// Already moving (a spot notice's make-before-break, now
			// fenced): keep when it was decided, and break now.
			m.DecidedAt = prev.DecidedAt
			if o.Mode == ModeMakeBeforeBreak {
				continue
			}
		}
		p.Moves = append(p.Moves, m)
	}
	return p
}

// Stale are the recorded moves (ids in the order listed) that a replica
// left unpublished at least minAge ago: it died between recording and
// handing them over, so they are queued again. Moves recorded as failed are
// left alone: they would fail again.
func Stale(ids []string, recorded map[string]Record, now time.Time, minAge time.Duration) []Move {
	var out []Move
	for _, id := range ids {
		m, ok := recorded[id]
		if !ok || m.Published || m.Failed != "" || now.Sub(m.DecidedAt) < minAge {
			continue
		}
		out = append(out, m.Move())
	}
	return out
}

// Orphans are the allocations on the dead node that no recorded move
// covers: none is recorded, or the recorded one is off another node (the
// rental moved here, then this node died). Nobody released them: a replica
// died between fencing the node and recording its moves.
func Orphans(node string, allocs []Allocation, moving map[string]Record) []Allocation {
	var out []Allocation
	for _, a := range allocs {
		if m, ok := moving[a.Rental]; !ok || m.FromNode != node {
			out = append(out, a)
		}
	}
	return out
}
