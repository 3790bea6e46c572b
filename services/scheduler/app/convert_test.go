package app

import (
	"reflect"
	"strings"
	"testing"
	"time"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func TestRequestsTakeTheirClassMarketAndDefaultHostShare(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		plan   shizuv1.Plan
		class  placement.Class
		market placement.Market
	}{
		{"a spot rental may run on any market", shizuv1.Plan_PLAN_SPOT, rent.ClassSpot, rent.AnyMarket},
		{"an on-demand rental runs only on on-demand nodes", shizuv1.Plan_PLAN_ON_DEMAND, rent.ClassOnDemand, rent.OnDemand},
		{"a reserved rental runs only on on-demand nodes", shizuv1.Plan_PLAN_RESERVED, rent.ClassReserved, rent.OnDemand},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := requestOf(&shizuv1.RentalRequested{RentalId: "r", TenantId: "t",
				Spec: &shizuv1.RentalSpec{GpuCount: 1, MilliGpu: 500, VramMib: 1024, Plan: tc.plan}})
			if r.Class != tc.class || r.Market != tc.market {
				t.Fatalf("class %v market %q", r.Class, r.Market)
			}
			// Half a GPU gets half the per-GPU default share of the host.
			if r.CPUMilli != DefaultCPUMilliPerGPU/2 || r.MemoryMiB != DefaultMemoryMiBPerGPU/2 {
				t.Fatalf("host share cpu %d mem %d", r.CPUMilli, r.MemoryMiB)
			}
		})
	}
}

func TestStoredNodesBecomePlacementNodesWithDomainsMIGAndClasses(t *testing.T) {
	t.Parallel()
	st := capacity.NodeState{
		Node: capacity.Node{ID: "n", Zone: "z", Market: capacity.MarketSpot, CPUMilli: 1000, MemoryMiB: 1000,
			GPUs: []capacity.GPU{{Index: 0, UUID: "g0", Model: "A100-SXM4-80GB", VRAMMiB: 80, MIGCapable: true, MIGEnabled: true,
				MIGInstances: []capacity.MIGInstance{{UUID: "MIG-a", Profile: "2g.20gb", VRAMMiB: 20}, {UUID: "MIG-b", Profile: "2g.20gb", VRAMMiB: 20}}},
				{Index: 1, UUID: "g1", Model: "A100-SXM4-80GB", VRAMMiB: 80}, {Index: 2, UUID: "g2", Model: "A100-SXM4-80GB", VRAMMiB: 80}},
			NVLinkDomains: [][]int{{1, 2}}},
		Status: capacity.StatusReady, Epoch: 3, FreeCPUMilli: 500, FreeMemoryMiB: 500,
		FreeGPUs: []capacity.FreeGPU{{Index: 0, Milli: 715, VRAMMiB: 60, Sharers: 1, MaxSharers: 2, FreeMIGInstances: []string{"MIG-b"}},
			{Index: 1, Milli: 1000, VRAMMiB: 80, MaxSharers: 4, Health: capacity.HealthFailed}, {Index: 2, Milli: 1000, VRAMMiB: 80, MaxSharers: 4}},
		Allocations: []capacity.Allocation{{Placement: capacity.Placement{RentalID: "mig", Tenant: "t",
			GPUs: []capacity.GPUShare{{Index: 0, Milli: 285, VRAMMiB: 20, MIGProfile: "2g.20gb", MIGInstance: "MIG-a"}}}, CreatedAt: time.Unix(100, 0)}},
	}
	n := nodeOf(&st, map[string]ports.Class{"mig": {Class: rent.ClassSpot, Priority: 7}})
	if !n.Ready || n.Epoch != 3 || n.Market != rent.Spot {
		t.Fatalf("node %+v", n)
	}
	if n.GPUs[0].NVLinkDomain != -1 || n.GPUs[1].NVLinkDomain != 0 || n.GPUs[2].NVLinkDomain != 0 {
		t.Fatalf("domains %d %d %d", n.GPUs[0].NVLinkDomain, n.GPUs[1].NVLinkDomain, n.GPUs[2].NVLinkDomain)
	}
	if n.GPUs[0].MIGSlices != 2 || n.GPUs[0].FreeMilli != 715 || !n.GPUs[0].MIGEnabled || n.GPUs[1].MIGEnabled ||
		!reflect.DeepEqual(n.GPUs[0].MIGInstances, []placement.MIGInstance{{UUID: "MIG-a", Profile: "2g.20gb", Holder: "mig"}, {UUID: "MIG-b", Profile: "2g.20gb"}}) ||
		n.Allocations[0].GPUs[0].MIGInstance != "MIG-a" {
		t.Fatalf("GPU 0: %+v", n.GPUs[0])
	}
	if n.GPUs[0].Unhealthy || !n.GPUs[1].Unhealthy || n.GPUs[2].Unhealthy {
		t.Fatalf("health: %v %v %v", n.GPUs[0].Unhealthy, n.GPUs[1].Unhealthy, n.GPUs[2].Unhealthy)
	}
	if a := n.Allocations[0]; a.Class != rent.ClassSpot || a.Priority != 7 || !a.Since.Equal(time.Unix(100, 0)) {
		t.Fatalf("allocation %+v", a)
	}
}

func TestConfigValidationNamesEveryProblem(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	cfg.Policy = "fixed"
	cfg.BatchSize = 0
	cfg.PendingTimeout = -time.Second
	cfg.MaxCandidates = -1
	err := cfg.Validate()
	for _, want := range []string{"scheduler.policy: fixed is a replay baseline", "scheduler.batch-size", "scheduler.pending-timeout", "scheduler.max-candidates"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	cfg = DefaultConfig()
	cfg.Policy = "greedy"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "greedy") {
		t.Errorf("unknown policy: %v", err)
	}
}
