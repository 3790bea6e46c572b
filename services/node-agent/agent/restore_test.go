package agent_test

import (
	"strings"
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/agent"
)

func TestTheStoreIsLostWhenItsGenerationIsNotTheOneRegisteredIn(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		known, current string
		lost           bool
	}{
		{"the same generation is the same store", "g1", "g1", false},
		{"a store without a generation lost its data", "g1", "", true},
		{"another generation is another store", "g1", "g2", true},
		{"an agent that never registered in a store with one has nothing to restore", "", "g2", false},
		{"nor does it before any registration", "", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := agent.StoreLost(c.known, c.current); got != c.lost {
				t.Fatalf("StoreLost(%q, %q) = %v, want %v", c.known, c.current, got, c.lost)
			}
		})
	}
}

func TestARestoreKeepsTheHighestEpochAndStopsWhatRanUnderAnOlderOne(t *testing.T) {
	t.Parallel()
	running := []agent.Rental{{RentalID: "b", Epoch: 3}, {RentalID: "a", Epoch: 2}, {RentalID: "c", Epoch: 3}}
	if e := agent.RestoreEpoch(2, running); e != 3 {
		t.Fatalf("restore epoch %d, want 3 (a workload's)", e)
	}
	if e := agent.RestoreEpoch(0, nil); e != 1 {
		t.Fatalf("restore epoch of an agent that knows none = %d, want 1", e)
	}
	keep, stops := agent.Restorable(3, running)
	if len(keep) != 2 || keep[0].RentalID != "b" || keep[1].RentalID != "c" {
		t.Fatalf("kept %+v, want b and c", keep)
	}
	if len(stops) != 1 || stops[0].Rental.RentalID != "a" || stops[0].Reason != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED ||
		!strings.Contains(stops[0].Message, "fenced") {
		t.Fatalf("stops %+v, want a, node failed (fenced)", stops)
	}
}

func TestARunWhoseRentalAnotherNodeHoldsStops(t *testing.T) {
	t.Parallel()
	running := []agent.Rental{{RentalID: "r2", Attempt: 1}, {RentalID: "r1", Attempt: 1}, {RentalID: "r3", Attempt: 2}}
	stops := agent.LostStops(running, []agent.Lost{{RentalID: "r3", NodeID: "n9", Attempt: 3}, {RentalID: "r1", NodeID: "n8", Attempt: 2}})
	if len(stops) != 2 || stops[0].Rental.RentalID != "r1" || stops[1].Rental.RentalID != "r3" {
		t.Fatalf("stops %+v, want r1 and r3", stops)
	}
	for _, s := range stops {
		if s.Reason != shizuv1.ExitReason_EXIT_REASON_NODE_FAILED || !strings.Contains(s.Message, "on node n") {
			t.Fatalf("stop %+v: want node failed, naming the node that holds it", s)
		}
	}
	if stops := agent.LostStops(running, nil); len(stops) != 0 {
		t.Fatalf("nothing lost, yet stops %+v", stops)
	}
}
