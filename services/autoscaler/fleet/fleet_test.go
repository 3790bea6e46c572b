package fleet_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
)

var t0 = time.Date(2026, 6, 18, 20, 0, 0, 0, time.UTC)

func config() fleet.Config {
	return fleet.Config{
		InstanceTypes: []fleet.InstanceType{
			{Name: "p5.48xlarge", Profile: "h100x8", Model: "H100-SXM5-80GB", GPUs: 8, Zones: []string{"z1", "z2"}, PricePerGPUHourMicros: 2_490_000},
			{Name: "p4de.24xlarge", Profile: "a100x8", Model: "A100-SXM4-80GB", GPUs: 8, PricePerGPUHourMicros: 1_790_000},
			{Name: "a100-pcie-4", Profile: "a100pcie4", Model: "A100-PCIE-40GB", GPUs: 4, PricePerGPUHourMicros: 1_200_000},
		},
		DefaultZone: "z1", MaxNodes: 10, MinNodes: 1,
		IdleAfter: fleet.Duration(10 * time.Minute), RegisterTimeout: fleet.Duration(2 * time.Minute),
	}
}

func TestPlanProvisionPicksTheCheapestTypeThatFits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		shortage  fleet.Shortage
		wantType  string
		wantCount int
		wantZone  string
	}{
		{"one GPU of any model goes to the cheapest type", fleet.Shortage{GPUCount: 1, Rentals: []string{"r1"}}, "a100-pcie-4", 1, "z1"},
		{"eight GPUs skip the four-GPU type", fleet.Shortage{GPUCount: 8, Rentals: []string{"r1", "r2"}}, "p4de.24xlarge", 2, "z1"},
		{"a model constraint is honoured", fleet.Shortage{GPUCount: 2, Models: []string{"H100-SXM5-80GB"}, Rentals: []string{"a", "b", "c", "d", "e"}}, "p5.48xlarge", 2, "z1"},
		{"a zone constraint is honoured", fleet.Shortage{GPUCount: 1, Zone: "z2", Rentals: []string{"r1"}}, "p5.48xlarge", 1, "z2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := fleet.PlanProvision(config(), c.shortage, 0, nil, fleet.OnDemand)
			if err != nil {
				t.Fatal(err)
			}
			if p.InstanceType.Name != c.wantType || p.Count != c.wantCount || p.Zone != c.wantZone || p.Market != fleet.OnDemand {
				t.Fatalf("got %+v", p)
			}
			if !strings.Contains(p.Reason, "capacity shortage") {
				t.Fatalf("reason %q", p.Reason)
			}
		})
	}
}

func TestPlanProvisionDoesNotProvisionTwiceForTheSameRentals(t *testing.T) {
	t.Parallel()
	covered := map[string]bool{"r1": true, "r2": true}
	s := fleet.Shortage{GPUCount: 8, Rentals: []string{"r1", "r2"}}
	p, err := fleet.PlanProvision(config(), s, 2, func(r string) bool { return covered[r] }, fleet.OnDemand)
	if err != nil || p.Count != 0 {
		t.Fatalf("got %+v, %v", p, err)
	}
	s.Rentals = append(s.Rentals, "r3")
	p, err = fleet.PlanProvision(config(), s, 2, func(r string) bool { return covered[r] }, fleet.OnDemand)
	if err != nil || p.Count != 1 || len(p.Rentals) != 1 || p.Rentals[0] != "r3" {
		t.Fatalf("got %+v, %v", p, err)
	}
}

func TestPlanProvisionRespectsMaxNodesAndSaysWhenNothingFits(t *testing.T) {
	t.Parallel()
	s := fleet.Shortage{GPUCount: 8, Rentals: []string{"a", "b", "c", "d"}}
	p, err := fleet.PlanProvision(config(), s, 8, nil, fleet.Spot)
	if err != nil || p.Count != 2 || p.Market != fleet.Spot || !strings.Contains(p.Reason, "capped by max_nodes") {
		t.Fatalf("got %+v, %v", p, err)
	}
	if _, err := fleet.PlanProvision(config(), s, 10, nil, fleet.OnDemand); !errors.Is(err, fleet.ErrFleetFull) {
		t.Fatalf("full fleet: %v", err)
	}
	s.GPUCount = 16
	if _, err := fleet.PlanProvision(config(), s, 0, nil, fleet.OnDemand); !errors.Is(err, fleet.ErrNoInstanceType) {
		t.Fatalf("16 GPUs: %v", err)
	}
}

func TestPlanReleaseDrainsIdleNodesFirstAndNeverTouchesOneInUse(t *testing.T) {
	t.Parallel()
	c := config()
	nodes := []fleet.NodeView{
		{ID: "busy", Status: fleet.Ready, Allocations: 2},
		{ID: "warm", Status: fleet.Ready, Busy: true, IdleSince: t0.Add(-time.Hour)},
		{ID: "idle-long", Status: fleet.Ready, IdleSince: t0.Add(-11 * time.Minute), Epoch: 3},
		{ID: "idle-short", Status: fleet.Ready, IdleSince: t0.Add(-time.Minute)},
		{ID: "draining-empty", Status: fleet.Draining, Epoch: 2},
		{ID: "draining-full", Status: fleet.Draining, Allocations: 1},
		{ID: "dead-empty", Status: fleet.Dead},
		{ID: "never-registered", Status: fleet.Unregistered, CreatedAt: t0.Add(-3 * time.Minute)},
		{ID: "booting", Status: fleet.Unregistered, CreatedAt: t0.Add(-30 * time.Second)},
	}
	got := map[string]fleet.ActionKind{}
	for _, a := range fleet.PlanRelease(c, nodes, t0) {
		got[a.Node] = a.Kind
		if a.Reason == "" {
			t.Errorf("action without reason: %+v", a)
		}
	}
	want := map[string]fleet.ActionKind{"idle-long": fleet.Drain, "draining-empty": fleet.Release,
		"dead-empty": fleet.Release, "never-registered": fleet.Release}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n, k := range want {
		if got[n] != k {
			t.Errorf("%s: got %q, want %q", n, got[n], k)
		}
	}
}

func TestPlanReleaseKeepsMinNodesReady(t *testing.T) {
	t.Parallel()
	c := config()
	c.MinNodes = 2
	old := t0.Add(-time.Hour)
	nodes := []fleet.NodeView{{ID: "a", Status: fleet.Ready, IdleSince: old}, {ID: "b", Status: fleet.Ready, IdleSince: old},
		{ID: "c", Status: fleet.Ready, IdleSince: old}}
	acts := fleet.PlanRelease(c, nodes, t0)
	if len(acts) != 1 || acts[0].Kind != fleet.Drain {
		t.Fatalf("got %+v", acts)
	}
}

func TestTrackIdleRemembersWhenANodeBecameIdle(t *testing.T) {
	t.Parallel()
	idle := fleet.TrackIdle(nil, []fleet.NodeView{{ID: "a"}, {ID: "b", Allocations: 1}}, t0)
	if !idle["a"].Equal(t0) || !idle["b"].IsZero() {
		t.Fatalf("got %v", idle)
	}
	idle = fleet.TrackIdle(idle, []fleet.NodeView{{ID: "a"}, {ID: "b"}}, t0.Add(time.Minute))
	if !idle["a"].Equal(t0) || !idle["b"].Equal(t0.Add(time.Minute)) {
		t.Fatalf("got %v", idle)
	}
}

// Property: PlanRelease never drains or releases a registered node that
// holds a rental or is busy.
func TestNothingInUseIsEverReleasedProperty(t *testing.T) {
	t.Parallel()
	statuses := []fleet.NodeStatus{fleet.Ready, fleet.Draining, fleet.Dead}
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 20).Draw(rt, "n")
		nodes := make([]fleet.NodeView, n)
		for i := range nodes {
			nodes[i] = fleet.NodeView{ID: string(rune('a' + i)),
				Status:      rapid.SampledFrom(statuses).Draw(rt, "status"),
				Allocations: rapid.IntRange(0, 2).Draw(rt, "allocs"),
				Busy:        rapid.Bool().Draw(rt, "busy"),
				IdleSince:   t0.Add(-time.Duration(rapid.IntRange(0, 7200).Draw(rt, "idle")) * time.Second)}
		}
		byID := map[string]fleet.NodeView{}
		for _, nv := range nodes {
			byID[nv.ID] = nv
		}
		for _, a := range fleet.PlanRelease(config(), nodes, t0) {
			if nv := byID[a.Node]; nv.Allocations > 0 || nv.Busy {
				rt.Fatalf("%s on a node in use: %+v", a.Kind, nv)
			}
		}
	})
}

func TestFreeSlotsCountsReplicasTheFreeCapacityHolds(t *testing.T) {
	t.Parallel()
	h := func(milli, vram int64, slots int) fleet.FreeGPU {
		return fleet.FreeGPU{Model: "H100", Milli: milli, VRAMMiB: vram, Slots: slots}
	}
	nodes := []fleet.FreeNode{
		{ID: "a", Ready: true, Zone: "z1", GPUs: []fleet.FreeGPU{h(1000, 80000, 4), h(1000, 80000, 4), h(1000, 80000, 4), h(500, 40000, 3)}},
		{ID: "b", Ready: false, Zone: "z1", GPUs: []fleet.FreeGPU{h(1000, 80000, 4), h(1000, 80000, 4)}},
		{ID: "c", Ready: true, Zone: "z2", GPUs: []fleet.FreeGPU{h(1000, 80000, 4), h(1000, 80000, 4)}},
	}
	cases := []struct {
		name  string
		shape fleet.Shape
		want  int
	}{
		{"one whole GPU per replica counts fully free GPUs of ready nodes", fleet.Shape{GPUCount: 1, MilliGPU: 1000}, 5},
		{"two GPUs per replica must come from one node", fleet.Shape{GPUCount: 2, MilliGPU: 1000}, 2},
		{"a zone constraint skips other zones", fleet.Shape{GPUCount: 1, MilliGPU: 1000, Zone: "z2"}, 2},
		{"quarter GPUs are bounded by milli, memory and sharer slots", fleet.Shape{GPUCount: 1, MilliGPU: 250, VRAMMiB: 20000}, 4 + 4 + 4 + 2 + 4 + 4},
		{"an unknown model fits nowhere", fleet.Shape{GPUCount: 1, MilliGPU: 1000, Models: []string{"B200"}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := fleet.FreeSlots(nodes, c.shape); got != c.want {
				t.Fatalf("got %d, want %d", got, c.want)
			}
		})
	}
}
