package view_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/view"
	"github.com/shizu-gpu/shizu/shared/rent"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func node(id string, n int) placement.Node {
	nd := placement.Node{ID: id, Epoch: 1, Ready: true, Zone: "zone-" + id, Market: rent.OnDemand,
		CPUMilli: 64_000, MemoryMiB: 1 << 18, FreeCPUMilli: 64_000, FreeMemoryMiB: 1 << 18}
	for i := range n {
		nd.GPUs = append(nd.GPUs, placement.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", id, i), Model: "H100-SXM5-80GB",
			VRAMMiB: 80 * 1024, FreeMilli: 1000, FreeVRAMMiB: 80 * 1024})
	}
	return nd
}

func request(id string) placement.Request {
	return placement.Request{ID: id, Tenant: "t", Class: rent.ClassOnDemand, GPUCount: 1, MilliPerGPU: 500, VRAMMiB: 1024,
		CPUMilli: 1000, MemoryMiB: 1024}
}

func share(node string) placement.Placement {
	return placement.Placement{NodeID: node, Epoch: 1, CPUMilli: 1000, MemoryMiB: 1024,
		GPUs: []placement.Share{{Index: 0, Milli: 500, VRAMMiB: 1024}}}
}

func TestAResetViewIndexesItsNodesAndForgetsWhatWasStale(t *testing.T) {
	t.Parallel()
	v := view.New(10)
	v.MarkStale("n1")
	v.Reset([]placement.Node{node("n1", 1), node("n2", 2)}, 7, t0)
	if v.Version() != 7 || !v.RefreshedAt().Equal(t0) || len(v.Cluster().Nodes) != 2 {
		t.Fatalf("version %d, refreshed %s, %d nodes", v.Version(), v.RefreshedAt(), len(v.Cluster().Nodes))
	}
	if n, ok := v.Node("n2"); !ok || len(n.GPUs) != 2 {
		t.Fatalf("Node(n2) = %+v, %v", n, ok)
	}
	if got := v.TakeStale(); got != nil {
		t.Fatalf("stale after reset: %v", got)
	}
}

func TestAPlacementAppliedAndRemovedLeavesTheNodeAsItWas(t *testing.T) {
	t.Parallel()
	v := view.New(10)
	v.Reset([]placement.Node{node("n1", 1)}, 1, t0)
	r := request("r1")
	v.Observe(&r)
	v.Workload()
	before := v.Fragmentation()
	v.Apply(&r, share("n1"), t0)
	n, _ := v.Node("n1")
	if n.GPUs[0].FreeMilli != 500 || len(n.Allocations) != 1 || v.Fragmentation() == before {
		t.Fatalf("after apply: free %d, %d allocations, meter %+v", n.GPUs[0].FreeMilli, len(n.Allocations), v.Fragmentation())
	}
	v.Remove("n1", "r1")
	if n.GPUs[0].FreeMilli != 1000 || len(n.Allocations) != 0 || v.Fragmentation() != before {
		t.Fatalf("after remove: free %d, %d allocations, meter %+v, want %+v", n.GPUs[0].FreeMilli, len(n.Allocations), v.Fragmentation(), before)
	}
}

func TestFixesPostedOffTheLoopReachTheViewWhenApplied(t *testing.T) {
	t.Parallel()
	v := view.New(10)
	v.Reset([]placement.Node{node("n1", 1), node("n2", 1)}, 1, t0)
	r := request("r1")
	v.Apply(&r, share("n1"), t0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.Post(view.Fix{Node: "n1", Rental: "r1", Stale: "n2"})
	}()
	<-done
	if n, _ := v.Node("n1"); len(n.Allocations) != 1 {
		t.Fatal("a posted fix changed the view before it was applied")
	}
	v.ApplyFixes()
	if n, _ := v.Node("n1"); len(n.Allocations) != 0 {
		t.Fatal("the fix did not take the rental out")
	}
	if got := v.TakeStale(); !slices.Equal(got, []string{"n2"}) {
		t.Fatalf("stale %v, want n2", got)
	}
	if got := v.TakeStale(); got != nil {
		t.Fatalf("stale taken twice: %v", got)
	}
}

func TestANodeReReadReplacesItsFactsAndAGoneNodeTakesNothing(t *testing.T) {
	t.Parallel()
	v := view.New(10)
	v.Reset([]placement.Node{node("n1", 1)}, 1, t0)
	if f := v.Facts("n1"); f == nil || f.Zone != "zone-n1" || f.GPUs[0].UUID != "GPU-n1-0" {
		t.Fatalf("facts %+v", f)
	}
	moved := node("n1", 2)
	moved.Zone = "zone-b"
	v.SetNode(moved)
	if f := v.Facts("n1"); f.Zone != "zone-b" || len(f.GPUs) != 2 {
		t.Fatalf("facts after re-read %+v", f)
	}
	v.SetNode(node("n3", 1))
	if _, ok := v.Node("n3"); !ok || v.Facts("nope") != nil {
		t.Fatal("a new node is not in the view, or an unknown one has facts")
	}
	v.NodeGone("n3")
	if n, _ := v.Node("n3"); n.Ready {
		t.Fatal("a node gone from the store is still ready in the view")
	}
}
