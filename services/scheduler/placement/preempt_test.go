package placement_test

import (
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// hold places an allocation of class c on GPU gpu of node n, running since
// `ago` before t0.
func hold(n *placement.Node, id string, c placement.Class, gpu int, milli int64, ago time.Duration) {
	r := placement.Request{ID: id, Tenant: "other", Class: c, GPUCount: 1, MilliPerGPU: milli, CPUMilli: 1000, MemoryMiB: 1024}
	vram := int64(10 * 1024)
	if milli == 1000 {
		vram = n.GPUs[gpu].VRAMMiB
	}
	n.Apply(&r, placement.Placement{NodeID: n.ID, CPUMilli: 1000, MemoryMiB: 1024,
		GPUs: []placement.Share{{Index: gpu, Milli: milli, VRAMMiB: vram}}}, t0.Add(-ago))
}

func TestPreemptionEvictsTheSpotRentalsThatLoseTheLeastWork(t *testing.T) {
	t.Parallel()
	// Node a: two spot rentals running 1 h each on whole GPUs.
	// Node b: one spot rental on a whole GPU running 10 min, and one on the
	// other GPU running 5 min. An on-demand 1-GPU request: evict the 5-min one.
	a := node("a", 2)
	hold(&a, "a-1", rent.ClassSpot, 0, 1000, time.Hour)
	hold(&a, "a-2", rent.ClassSpot, 1, 1000, time.Hour)
	b := node("b", 2)
	hold(&b, "b-1", rent.ClassSpot, 0, 1000, 10*time.Minute)
	hold(&b, "b-2", rent.ClassSpot, 1, 1000, 5*time.Minute)
	c := &placement.Cluster{Nodes: []placement.Node{a, b}}
	r := req("od")
	pl := placer(t, placement.PolicyFGD)
	if _, err := pl.Place(c, &r); err == nil {
		t.Fatal("the cluster is full; the request must not fit without preemption")
	}
	plan, ok := pl.PlanPreemption(c, &r, t0)
	if !ok {
		t.Fatal("want a preemption plan")
	}
	if plan.NodeID != "b" || len(plan.Victims) != 1 || plan.Victims[0].RentalID != "b-2" || plan.LostGPUSeconds != 300 {
		t.Fatalf("want to evict b-2 (300 GPU-seconds), got %+v", plan)
	}
	if plan.Placement.GPUs[0].Index != 1 {
		t.Fatalf("want the request on b's GPU 1, got %+v", plan.Placement)
	}
}

func TestPreemptionTakesSeveralSmallVictimsWhenTheyAreCheaper(t *testing.T) {
	t.Parallel()
	// One GPU with two 500-milli spot rentals (2 min each), another with a
	// whole-GPU spot rental running 1 h: evicting both halves costs
	// 2·0.5·120 = 120 GPU-seconds, less than 3600.
	n := node("n", 2)
	hold(&n, "half-1", rent.ClassSpot, 0, 500, 2*time.Minute)
	hold(&n, "half-2", rent.ClassSpot, 0, 500, 2*time.Minute)
	hold(&n, "whole", rent.ClassSpot, 1, 1000, time.Hour)
	r := req("od")
	plan, ok := placer(t, placement.PolicyBestFit).PlanPreemption(&placement.Cluster{Nodes: []placement.Node{n}}, &r, t0)
	if !ok || len(plan.Victims) != 2 || plan.LostGPUSeconds != 120 {
		t.Fatalf("want both halves evicted for 120 GPU-seconds, got %+v %v", plan, ok)
	}
}

func TestPreemptionNeverTouchesEqualOrHigherClasses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		holder  placement.Class
		request placement.Class
	}{
		{"on-demand does not evict on-demand", rent.ClassOnDemand, rent.ClassOnDemand},
		{"on-demand does not evict reserved", rent.ClassReserved, rent.ClassOnDemand},
		{"reserved does not evict on-demand", rent.ClassOnDemand, rent.ClassReserved},
		{"spot does not evict spot", rent.ClassSpot, rent.ClassSpot},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := node("n", 1)
			hold(&n, "holder", tc.holder, 0, 1000, time.Minute)
			r := req("r", func(r *placement.Request) { r.Class = tc.request })
			if plan, ok := placer(t, placement.PolicyFGD).PlanPreemption(&placement.Cluster{Nodes: []placement.Node{n}}, &r, t0); ok {
				t.Fatalf("want no plan, got %+v", plan)
			}
		})
	}
	// Reserved may evict spot.
	n := node("n", 1)
	hold(&n, "spot", rent.ClassSpot, 0, 1000, time.Minute)
	r := req("r", func(r *placement.Request) { r.Class = rent.ClassReserved })
	if _, ok := placer(t, placement.PolicyFGD).PlanPreemption(&placement.Cluster{Nodes: []placement.Node{n}}, &r, t0); !ok {
		t.Fatal("reserved must be able to evict spot")
	}
}

func TestShortageNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	a := node("a", 8)
	for i := range 6 {
		use(&a, i, 1000, 80*1024)
	}
	a.FreeCPUMilli = 124_000
	b := with(node("b", 8), func(n *placement.Node) { n.Zone = "zone-b" }) // filtered by zone
	r := req("r", gpus(4), func(r *placement.Request) { r.Zone = "zone-a"; r.CPUMilli = 126_000; r.MemoryMiB = 0 })
	m := placer(t, placement.PolicyFGD).Shortage(&placement.Cluster{Nodes: []placement.Node{a, b}}, &r)
	want := placement.Missing{GPUCount: 2, MilliPerGPU: 1000, CPUMilli: 2000}
	if m != want {
		t.Fatalf("missing %+v, want %+v", m, want)
	}
	// Nothing passes the static filters: the whole request is missing.
	r.Zone = "zone-c"
	m = placer(t, placement.PolicyFGD).Shortage(&placement.Cluster{Nodes: []placement.Node{a, b}}, &r)
	if m.GPUCount != 4 || m.CPUMilli != 126_000 {
		t.Fatalf("missing %+v, want the whole request", m)
	}
}
