package app

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
)

// A moved rental that fits nowhere at once waits in the pending set; its
// retry still prefers the GPU model it ran on, so with an H100 and an
// A100 node free it goes back to the A100.
func TestAPendingMovedRentalKeepsItsPreferredModel(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.res = porttest.NewReserver(porttest.FakeNode{ID: "n1", Epoch: 1, GPUs: 2}, porttest.FakeNode{ID: "n2", Epoch: 1, GPUs: 2})
	r.s.reserve = r.res
	h100, _ := r.s.view.Node("n1")
	a100 := *h100
	a100.ID, a100.GPUs = "n2", slices.Clone(h100.GPUs)
	for i := range a100.GPUs {
		a100.GPUs[i].Model, a100.GPUs[i].UUID = "A100-SXM4-80GB", fmt.Sprintf("GPU-n2-%d", i)
	}
	full := func(n placement.Node, free int64) placement.Node {
		n.GPUs = slices.Clone(n.GPUs)
		for i := range n.GPUs {
			n.GPUs[i].FreeMilli = free
		}
		return n
	}
	r.s.view.SetNode(full(*h100, 0))
	r.s.view.SetNode(full(a100, 0))

	moved := r.job("moved", 1, roundNow.Add(-time.Minute))
	moved.Attempt = 2
	moved.Request.PreferredModels = []string{"A100-SXM4-80GB"}
	if errs := r.decide(t, moved); errs[0] != nil {
		t.Fatal(errs[0])
	}
	entries, _, err := r.rec.Pending(t.Context())
	if err != nil || len(entries) != 1 {
		t.Fatalf("pending %+v, %v", entries, err)
	}
	if got := entries[0].PreferredModels; !slices.Equal(got, []string{"A100-SXM4-80GB"}) {
		t.Fatalf("the pending entry prefers %v, want the model the rental ran on", got)
	}

	r.s.view.SetNode(full(*h100, 1000))
	r.s.view.SetNode(full(a100, 1000))
	if errs := r.decide(t, r.s.pendingJob(entries[0])); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if a, err := r.res.Allocation(t.Context(), "moved"); err != nil || a.NodeID != "n2" {
		t.Fatalf("retried onto %+v (%v), want the A100 node n2", a, err)
	}
}
