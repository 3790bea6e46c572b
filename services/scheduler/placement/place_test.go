package placement_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

func TestEachFilterTurnsAwayTheNodeItChecks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		node   placement.Node
		req    placement.Request
		reason placement.Reason
	}{
		{"a node that is not ready takes nothing", with(node("n", 8), func(n *placement.Node) { n.Ready = false }), req("r"), placement.ReasonNotReady},
		{"a request for another zone skips the node", node("n", 8), req("r", func(r *placement.Request) { r.Zone = "zone-b" }), placement.ReasonZone},
		{"a request for the spot market skips an on-demand node", node("n", 8), req("r", func(r *placement.Request) { r.Market = rent.Spot }), placement.ReasonMarket},
		{"a TEE request skips a node without TEE", node("n", 8), req("r", func(r *placement.Request) { r.TEE = true }), placement.ReasonTEE},
		{"a request for other models skips the node", node("n", 8), req("r", func(r *placement.Request) { r.Models = []string{"L40S-48GB"} }), placement.ReasonModel},
		{"a request for ray-tracing cores skips H100s", node("n", 8), req("r", func(r *placement.Request) { r.Capabilities = []string{"rt-cores"} }), placement.ReasonCapability},
		{"a request for more memory bandwidth than the GPU has skips it", node("n", 8), req("r", func(r *placement.Request) { r.Capabilities = []string{"membw-4000"} }), placement.ReasonCapability},
		{"a request for more host CPU than is free skips the node", node("n", 8), req("r", func(r *placement.Request) { r.CPUMilli = 200_000 }), placement.ReasonCPU},
		{"a request for more host memory than is free skips the node", node("n", 8), req("r", func(r *placement.Request) { r.MemoryMiB = 2 << 20 }), placement.ReasonMemory},
		{"a request for more GPUs than the node has skips it", node("n", 2), req("r", gpus(4)), placement.ReasonGPUs},
		{"a fraction skips a GPU whose VRAM is taken", with(node("n", 1), func(n *placement.Node) { use(n, 0, 100, 75*1024) }), req("r", fraction(200, 10*1024)), placement.ReasonGPUs},
		{"a fraction skips a GPU at its sharer cap", with(node("n", 1), func(n *placement.Node) {
			for range 4 {
				use(n, 0, 100, 1024)
			}
		}), req("r", fraction(100, 1024)), placement.ReasonGPUs},
		{"a whole GPU skips a shared GPU", with(node("n", 1), func(n *placement.Node) { use(n, 0, 100, 1024) }), req("r"), placement.ReasonGPUs},
		{"a whole GPU skips an unhealthy GPU", with(node("n", 1), func(n *placement.Node) { n.GPUs[0].Unhealthy = true }), req("r"), placement.ReasonGPUs},
		{"a fraction skips an unhealthy GPU", with(node("n", 1), func(n *placement.Node) { n.GPUs[0].Unhealthy = true }), req("r", fraction(100, 1024)), placement.ReasonGPUs},
		{"an NVLink pair skips a domain with an unhealthy GPU", with(node("n", 2), func(n *placement.Node) { n.GPUs[1].Unhealthy = true }),
			req("r", gpus(2), func(r *placement.Request) { r.NVLink = true }), placement.ReasonGPUs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, pol := range placement.Policies {
				c := &placement.Cluster{Nodes: []placement.Node{tc.node}}
				_, err := placer(t, pol).Place(c, &tc.req)
				var nf *placement.NoFitError
				if !errors.As(err, &nf) {
					t.Fatalf("%s: want no fit, got %v", pol, err)
				}
				if nf.Rejected[tc.reason] != 1 {
					t.Fatalf("%s: want the node turned away by %q, got %v", pol, tc.reason, nf.Rejected)
				}
			}
		})
	}
}

func TestAMatchingNodePassesEveryFilter(t *testing.T) {
	t.Parallel()
	n := with(node("n", 8), func(n *placement.Node) { n.TEE, n.Market, n.Zone = true, rent.Spot, "zone-b" })
	r := req("r", func(r *placement.Request) {
		r.Zone, r.Market, r.TEE = "zone-b", rent.Spot, true
		r.Models, r.Capabilities = []string{"H100-SXM5-80GB"}, []string{"fp8", "membw-3000"}
	})
	for _, pol := range placement.Policies {
		p, err := placer(t, pol).Place(&placement.Cluster{Nodes: []placement.Node{n}}, &r)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		if p.NodeID != "n" || len(p.GPUs) != 1 || p.Model != "H100-SXM5-80GB" {
			t.Fatalf("%s: %+v", pol, p)
		}
	}
}

func TestInvalidRequestsAreRejectedWithTheReason(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, field, says string
		edit              func(*placement.Request)
	}{
		{"a rental that asks for nothing", "gpu_count", "no GPU and no CPU", func(r *placement.Request) { r.GPUCount, r.CPUMilli = 0, 0 }},
		{"a CPU-only task that asks for milli-GPU", "gpu_count", "CPU-only", func(r *placement.Request) { r.GPUCount = 0 }},
		{"a negative GPU count", "gpu_count", "negative", func(r *placement.Request) { r.GPUCount = -1 }},
		{"milli-GPU above 1000", "milli_gpu", "out of range", func(r *placement.Request) { r.MilliPerGPU = 1500 }},
		{"a fraction with more than one GPU", "milli_gpu", "only with one GPU", func(r *placement.Request) { r.GPUCount, r.MilliPerGPU = 2, 500 }},
		{"an unknown model", "allowed_models", "unknown model", func(r *placement.Request) { r.Models = []string{"Voodoo2"} }},
		{"VRAM above any model's", "vram_mib", "more than any allowed model", func(r *placement.Request) { r.VRAMMiB = 200 * 1024 }},
		{"VRAM above the allowed model's", "vram_mib", "more than any allowed model", func(r *placement.Request) { r.Models, r.VRAMMiB = []string{"T4"}, 20*1024 }},
		{"negative CPU", "cpu_milli", "negative", func(r *placement.Request) { r.CPUMilli = -1 }},
		{"negative memory", "memory_mib", "negative", func(r *placement.Request) { r.MemoryMiB = -1 }},
		{"negative VRAM", "vram_mib", "negative", func(r *placement.Request) { r.VRAMMiB = -5 }},
		{"an unknown capability", "required_capabilities", "no model has", func(r *placement.Request) { r.Capabilities = []string{"warp-drive"} }},
		{"a malformed MIG profile", "mig_profile", "not a MIG profile", func(r *placement.Request) { r.MIGProfile = "5g.10gb" }},
		{"NVLink for one GPU", "interconnect", "at least two", func(r *placement.Request) { r.NVLink = true }},
		{"a maximum spot price on an on-demand request", "max_spot_price", "only for spot", func(r *placement.Request) {
			r.MaxSpotPrice = placement.Price{Micros: 1_000_000, Currency: "USD"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := req("r", tc.edit)
			_, err := placer(t, placement.PolicyFGD).Place(&placement.Cluster{Nodes: []placement.Node{node("n", 8)}}, &r)
			var inv *placement.InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("want invalid, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("want %s: ...%s..., got %v", tc.field, tc.says, err)
			}
		})
	}
}

func TestMultiGPUNVLinkRequestsLandInsideOneDomain(t *testing.T) {
	t.Parallel()
	// Two domains of four; domain 0 has two GPUs taken, so only domain 1
	// has room for four NVLink GPUs, although the node has six free.
	n := with(node("n", 8), func(n *placement.Node) {
		for i := range n.GPUs {
			n.GPUs[i].NVLinkDomain = i / 4
		}
		use(n, 0, 1000, 80*1024)
		use(n, 1, 1000, 80*1024)
	})
	r := req("r", gpus(4), func(r *placement.Request) { r.NVLink = true })
	for _, pol := range placement.Policies {
		p, err := placer(t, pol).Place(&placement.Cluster{Nodes: []placement.Node{n}}, &r)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		for _, s := range p.GPUs {
			if s.Index < 4 {
				t.Fatalf("%s: GPU %d is outside domain 1: %+v", pol, s.Index, p.GPUs)
			}
		}
	}
	// Five NVLink GPUs fit in no domain.
	r5 := req("r5", gpus(5), func(r *placement.Request) { r.NVLink = true })
	if _, err := placer(t, placement.PolicyFGD).Place(&placement.Cluster{Nodes: []placement.Node{n}}, &r5); !errors.Is(err, placement.ErrNoFit) {
		t.Fatalf("want no fit for 5 NVLink GPUs in domains of 4, got %v", err)
	}
}

func TestNVLinkTakesTheTightestDomainThatFits(t *testing.T) {
	t.Parallel()
	n := with(node("n", 8), func(n *placement.Node) {
		for i := range n.GPUs {
			n.GPUs[i].NVLinkDomain = i / 4
		}
		use(n, 4, 1000, 80*1024) // domain 1 has 3 free, domain 0 has 4
	})
	r := req("r", gpus(2), func(r *placement.Request) { r.NVLink = true })
	p, err := placer(t, placement.PolicyFGD).Place(&placement.Cluster{Nodes: []placement.Node{n}}, &r)
	if err != nil {
		t.Fatal(err)
	}
	if p.GPUs[0].Index < 5 || p.GPUs[1].Index < 5 {
		t.Fatalf("want two GPUs of domain 1 (5..7), keeping domain 0 whole; got %+v", p.GPUs)
	}
}

func TestMultiGPUWithoutNVLinkTakesTheFewestPCIeHops(t *testing.T) {
	t.Parallel()
	// GPUs 0, 2 and 3 free: 2 and 3 share a PCIe switch (1 hop), 0 is on
	// another switch.
	n := with(node("n", 4), func(n *placement.Node) { use(n, 1, 1000, 80*1024) })
	r := req("r", gpus(2))
	p, err := placer(t, placement.PolicyBestFit).Place(&placement.Cluster{Nodes: []placement.Node{n}}, &r)
	if err != nil {
		t.Fatal(err)
	}
	if p.GPUs[0].Index != 2 || p.GPUs[1].Index != 3 {
		t.Fatalf("want GPUs 2 and 3 on one switch, got %+v", p.GPUs)
	}
}

// migMode puts GPU i of n in MIG mode with instances of the given profiles,
// named MIG-<node>-<i>-<k>.
func migMode(n *placement.Node, i int, profiles ...string) {
	n.GPUs[i].MIGEnabled = true
	for k, p := range profiles {
		n.GPUs[i].MIGInstances = append(n.GPUs[i].MIGInstances, placement.MIGInstance{UUID: fmt.Sprintf("MIG-%s-%d-%d", n.ID, i, k), Profile: p})
	}
	n.GPUs[i].MaxSharers = max(1, len(profiles))
}

func TestMIGRentalsLandOnFreeInstancesOfTheirProfileOnly(t *testing.T) {
	t.Parallel()
	mig := func(profile string) func(*placement.Request) {
		return func(r *placement.Request) { r.MIGProfile = profile }
	}
	// GPU 0 is partitioned 3g.40gb + 2 × 2g.20gb, GPU 1 7 × 1g.10gb, GPU 2
	// is MIG-capable but not in MIG mode, GPU 3 is in MIG mode without
	// instances.
	n := node("n", 4)
	migMode(&n, 0, "3g.40gb", "2g.20gb", "2g.20gb")
	migMode(&n, 1, "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")
	migMode(&n, 3)
	for _, pol := range placement.Policies {
		c := &placement.Cluster{Nodes: []placement.Node{n.Clone()}}
		pl := placer(t, pol)
		held := map[string]string{}
		place := func(id, profile string) (placement.Placement, error) {
			r := req(id, mig(profile))
			p, err := pl.Place(c, &r)
			if err == nil {
				c.Nodes[0].Apply(&r, p, t0)
			}
			return p, err
		}
		// Both 2g.20gb instances of GPU 0, then no third.
		for _, id := range []string{"a", "b"} {
			p, err := place(id, "2g.20gb")
			if err != nil {
				t.Fatalf("%s: %s: %v", pol, id, err)
			}
			sh := p.GPUs[0]
			if sh.Index != 0 || sh.MIGProfile != "2g.20gb" || sh.MIGInstance == "" || held[sh.MIGInstance] != "" {
				t.Fatalf("%s: %s: want a free 2g.20gb instance of GPU 0, got %+v (held %v)", pol, id, sh, held)
			}
			held[sh.MIGInstance] = id
		}
		if _, err := place("c", "2g.20gb"); !errors.Is(err, placement.ErrNoFit) {
			t.Fatalf("%s: a third 2g.20gb must find no instance, got %v", pol, err)
		}
		// A 4g.40gb exists nowhere, though slices would allow it on GPU 2.
		if _, err := place("d", "4g.40gb"); !errors.Is(err, placement.ErrNoFit) {
			t.Fatalf("%s: a profile no GPU is partitioned into must not fit, got %v", pol, err)
		}
		// Seven 1g.10gb rentals take GPU 1's seven instances, one each.
		for k := range 7 {
			p, err := place(fmt.Sprintf("s%d", k), "1g.10gb")
			if err != nil || p.GPUs[0].Index != 1 || held[p.GPUs[0].MIGInstance] != "" {
				t.Fatalf("%s: 1g.10gb #%d: %+v %v", pol, k, p, err)
			}
			held[p.GPUs[0].MIGInstance] = p.NodeID
		}
		// A fraction and a whole GPU land only on GPU 2, not in MIG mode.
		for _, r := range []placement.Request{req("f", fraction(100, 1024)), req("w")} {
			p, err := pl.Place(c, &r)
			if err != nil || p.GPUs[0].Index != 2 {
				t.Fatalf("%s: %s must land on GPU 2, got %+v %v", pol, r.ID, p, err)
			}
		}
		// Releasing a rental frees its instance for the next one.
		if !c.Nodes[0].Remove("a") {
			t.Fatal("remove a")
		}
		if p, err := place("e", "2g.20gb"); err != nil || p.GPUs[0].MIGInstance == "" {
			t.Fatalf("%s: after a release the instance is free again: %+v %v", pol, p, err)
		}
	}
}

func TestFractionsPackOntoSharedGPUsUpToTheSharerCap(t *testing.T) {
	t.Parallel()
	for _, pol := range []placement.Policy{placement.PolicyFGD, placement.PolicyBestFit, placement.PolicyDotProduct, placement.PolicyFirstFit} {
		c := &placement.Cluster{Nodes: []placement.Node{node("n", 2)}}
		pl := placer(t, pol)
		perGPU := map[int]int{}
		for i := range 8 {
			r := req(string(rune('a'+i)), fraction(100, 1024))
			p, err := pl.Place(c, &r)
			if err != nil {
				t.Fatalf("%s: fraction %d: %v", pol, i, err)
			}
			perGPU[p.GPUs[0].Index]++
			c.Nodes[0].Apply(&r, p, t0)
		}
		if perGPU[0] != 4 || perGPU[1] != 4 {
			t.Fatalf("%s: want 4 sharers on each GPU (cap 4), got %v", pol, perGPU)
		}
		r := req("z", fraction(100, 1024))
		if _, err := pl.Place(c, &r); !errors.Is(err, placement.ErrNoFit) {
			t.Fatalf("%s: a ninth sharer must not fit, got %v", pol, err)
		}
	}
}

func TestFixedAllocationRoundsFractionsUpToWholeGPUs(t *testing.T) {
	t.Parallel()
	c := &placement.Cluster{Nodes: []placement.Node{node("n", 2)}}
	pl := placer(t, placement.PolicyFixed)
	for i := range 2 {
		r := req(string(rune('a'+i)), fraction(100, 1024))
		p, err := pl.Place(c, &r)
		if err != nil {
			t.Fatal(err)
		}
		if p.GPUs[0].Milli != 1000 || p.GPUs[0].VRAMMiB != 80*1024 {
			t.Fatalf("want a whole GPU, got %+v", p.GPUs)
		}
		c.Nodes[0].Apply(&r, p, t0)
	}
	r := req("c", fraction(100, 1024))
	if _, err := pl.Place(c, &r); !errors.Is(err, placement.ErrNoFit) {
		t.Fatalf("fixed allocation shares nothing: want no fit, got %v", err)
	}
}

func TestPlacementIsDeterministicForTheSameRequest(t *testing.T) {
	t.Parallel()
	var nodes []placement.Node
	for i := range 50 {
		nodes = append(nodes, node(string(rune('A'+i%26))+string(rune('a'+i/26)), 8))
	}
	c := &placement.Cluster{Nodes: nodes}
	for _, pol := range placement.Policies {
		r := req("same-id", fraction(300, 4096))
		a, err1 := placer(t, pol).Place(c, &r)
		b, err2 := placer(t, pol).Place(c, &r)
		if err1 != nil || err2 != nil || a.NodeID != b.NodeID || a.GPUs[0] != b.GPUs[0] {
			t.Fatalf("%s: %+v %v vs %+v %v", pol, a, err1, b, err2)
		}
	}
	// Random spreads different ids over different nodes.
	seen := map[string]bool{}
	for i := range 20 {
		r := req(string(rune('a'+i)), fraction(300, 4096))
		p, err := placer(t, placement.PolicyRandom).Place(c, &r)
		if err != nil {
			t.Fatal(err)
		}
		seen[p.NodeID] = true
	}
	if len(seen) < 5 {
		t.Fatalf("random placed 20 requests on only %d nodes", len(seen))
	}
}

func TestUnknownPolicyIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := placement.NewPlacer(placement.Options{Policy: "greedy"}); err == nil || !strings.Contains(err.Error(), "greedy") {
		t.Fatalf("want an error naming the policy, got %v", err)
	}
}

func TestCPUOnlyTasksTakeHostCPUAndNoGPU(t *testing.T) {
	t.Parallel()
	n := with(node("n", 2), func(n *placement.Node) { n.FreeCPUMilli = 3000 })
	cpu := req("cpu", func(r *placement.Request) { r.GPUCount, r.MilliPerGPU, r.CPUMilli, r.MemoryMiB = 0, 0, 2000, 1024 })
	for _, pol := range placement.Policies {
		c := &placement.Cluster{Nodes: []placement.Node{n}}
		p, err := placer(t, pol).Place(c, &cpu)
		if err != nil || len(p.GPUs) != 0 || p.CPUMilli != 2000 {
			t.Fatalf("%s: %+v %v", pol, p, err)
		}
		c.Nodes[0].Apply(&cpu, p, t0)
		again := cpu
		again.ID = "cpu2"
		if _, err := placer(t, pol).Place(c, &again); !errors.Is(err, placement.ErrNoFit) {
			t.Fatalf("%s: a second 2-core task must not fit in 1 free core, got %v", pol, err)
		}
	}
}

// Every policy keeps off an unhealthy GPU and places on the node's healthy
// ones.
func TestNoPolicyPlacesOnAnUnhealthyGPU(t *testing.T) {
	t.Parallel()
	for _, pol := range placement.Policies {
		n := node("n", 4)
		n.GPUs[0].Unhealthy, n.GPUs[2].Unhealthy = true, true
		c := &placement.Cluster{Nodes: []placement.Node{n}}
		pl := placer(t, pol)
		for i, r := range []placement.Request{req("a", fraction(250, 1024)), req("b"), req("c", fraction(500, 1024)), req("d", gpus(1))} {
			p, err := pl.Place(c, &r)
			if err != nil {
				if i == 0 {
					t.Fatalf("%s: %s: %v", pol, r.ID, err)
				}
				continue
			}
			for _, sh := range p.GPUs {
				if sh.Index == 0 || sh.Index == 2 {
					t.Fatalf("%s: %s placed on unhealthy GPU %d", pol, r.ID, sh.Index)
				}
			}
			c.Nodes[0].Apply(&r, p, time.Time{})
		}
	}
}
