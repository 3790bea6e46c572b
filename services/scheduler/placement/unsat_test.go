package placement_test

import (
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// rtx is a ready on-demand node in zone-a with n RTX 4090s (no NVLink, no
// TEE, no MIG), 64 cores and 256 GiB.
func rtx(id string, n int) placement.Node {
	return with(node(id, n), func(nd *placement.Node) {
		nd.CPUMilli, nd.MemoryMiB = 64_000, 256*1024
		for i := range nd.GPUs {
			g := &nd.GPUs[i]
			g.Model, g.VRAMMiB, g.FreeVRAMMiB, g.MIGCapable, g.NVLinkDomain = "RTX4090-24GB", 24*1024, 24*1024, false, -1
		}
	})
}

// withMIG puts GPU 0 of an H100 node in MIG mode with one 1g.10gb instance.
func withMIG(n placement.Node) placement.Node {
	return with(n, func(nd *placement.Node) {
		nd.GPUs[0].MIGEnabled = true
		nd.GPUs[0].MIGInstances = []placement.MIGInstance{{UUID: "MIG-0", Profile: "1g.10gb"}}
	})
}

func TestUnsatisfiableNamesTheConstraintNoNodeOrInstanceTypeMeets(t *testing.T) {
	t.Parallel()
	h100 := withMIG(with(node("h100", 8), func(nd *placement.Node) { nd.TEE = true }))
	nodes := []placement.Node{h100, rtx("rtx", 4)}
	h200 := placement.Offer{Name: "p5e.48xlarge", Model: "H200-SXM5-141GB", GPUs: 8, Zones: []string{"zone-b"}}
	cases := []struct {
		name   string
		nodes  []placement.Node
		offers []placement.Offer
		req    placement.Request
		want   string // "" when it could be placed; else a part of the reason
	}{
		{"fits an H100 node", nodes, nil, req("ok", gpus(8)), ""},
		{"GPU count", nodes, nil, req("r", gpus(9)), "needs 9 GPUs on one node; the largest node has 8"},
		{"GPU count of a model", nodes, nil, req("r", gpus(5), models("RTX4090-24GB")), "needs 5 GPUs on one node; the largest node of RTX4090-24GB has 4"},
		{"NVLink", nodes, nil, req("r", gpus(2), models("RTX4090-24GB"), nvlink), "NVLink: no RTX4090-24GB node has 2 GPUs linked by NVLink (at most 0)"},
		{"TEE", nodes, nil, req("r", models("RTX4090-24GB"), tee), "TEE: no RTX4090-24GB node has confidential computing"},
		{"zone", nodes, nil, req("r", zone("mars")), `zone "mars": no node is in that zone (zones: zone-a)`},
		{"model", []placement.Node{rtx("rtx", 4)}, nil, req("r", models("H100-SXM5-80GB")), "GPU model H100-SXM5-80GB: no node has it (models: RTX4090-24GB)"},
		{"market", nodes, nil, req("r", func(r *placement.Request) { r.Market = rent.Spot }), "market spot: no node is bought spot"},
		{"capability", nodes, nil, req("r", models("RTX4090-24GB"), func(r *placement.Request) { r.Capabilities = []string{"mig"} }), "capabilities mig: no RTX4090-24GB node has them all"},
		{"MIG profile", nodes, nil, req("r", mig("3g.40gb")), "MIG profile 3g.40gb: no node has a GPU with a MIG instance of that profile"},
		{"MIG profile a node has", nodes, nil, req("r", mig("1g.10gb")), ""},
		{"GPU memory", []placement.Node{rtx("rtx", 4)}, nil, req("r", fraction(500, 30*1024)), "GPU memory: needs 30720 MiB per GPU; the most any node has is 24576 MiB"},
		{"host CPU", nodes, nil, req("r", func(r *placement.Request) { r.CPUMilli = 200_000 }), "host CPU: needs 200 cores on one node; the largest node has 128"},
		{"host memory", nodes, nil, req("r", func(r *placement.Request) { r.MemoryMiB = 2 << 20 }), "host memory: needs 2097152 MiB on one node; the largest node has 1048576 MiB"},
		// What no node holds but an instance type the autoscaler may
		// provision does stays satisfiable: it is worth scaling for.
		{"count an instance type holds", nodes, []placement.Offer{h200}, req("r", gpus(8), zone("zone-b")), ""},
		{"zone of an instance type", nodes, []placement.Offer{h200}, req("r", zone("zone-b")), ""},
		{"NVLink of an instance type", []placement.Node{rtx("rtx", 4)}, []placement.Offer{h200}, req("r", gpus(4), nvlink), ""},
		{"TEE of an instance type", []placement.Node{rtx("rtx", 4)}, []placement.Offer{h200}, req("r", tee), ""},
		{"MIG of an instance type", []placement.Node{rtx("rtx", 4)}, []placement.Offer{h200}, req("r", mig("3g.40gb")), ""},
		{"host CPU: an instance type may have it", nodes, []placement.Offer{h200}, req("r", func(r *placement.Request) { r.CPUMilli = 200_000 }), ""},
		{"too many GPUs for the instance types too", nodes, []placement.Offer{h200}, req("r", gpus(16)), "needs 16 GPUs on one node; the largest node or instance type the autoscaler may provision has 8"},
		{"a zone the instance types lack", nodes, []placement.Offer{h200}, req("r", zone("mars")), `zone "mars": no node or instance type the autoscaler may provision is in that zone (zones: zone-a, zone-b)`},
		{"an instance type without TEE", []placement.Node{rtx("rtx", 4)}, []placement.Offer{{Name: "g6", Model: "L4-24GB", GPUs: 4, Zones: []string{"zone-a"}}},
			req("r", tee), "TEE: no L4-24GB, RTX4090-24GB node or instance type the autoscaler may provision has confidential computing"},
		// A node judged on its whole shape: full, draining or failed, it
		// still could hold the request once free.
		{"a full, not ready node counts", []placement.Node{with(node("busy", 8), func(nd *placement.Node) {
			nd.Ready = false
			for i := range nd.GPUs {
				use(nd, i, 1000, 80*1024)
			}
			nd.FreeCPUMilli = 0
		})}, nil, req("r", gpus(8)), ""},
		// Nothing registered and nothing to provision: nothing to judge
		// against, so nothing is ruled out (the caller keeps it pending).
		{"empty fleet", nil, nil, req("r", gpus(64)), ""},
	}
	c := placement.DefaultCatalogue()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req
			got := placement.Unsatisfiable(&r, &placement.Fleet{Nodes: tc.nodes, Offers: tc.offers}, c)
			switch {
			case tc.want == "" && got != "":
				t.Fatalf("ruled out: %q; want it satisfiable", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Fatalf("reason %q; want it to contain %q", got, tc.want)
			}
			for _, leak := range []string{"REJECT_", "GpuCount", "gpu_count", "tee_required", "INTERCONNECT"} {
				if strings.Contains(got, leak) {
					t.Fatalf("reason %q names the proto's %s", got, leak)
				}
			}
		})
	}
}

func models(m ...string) func(*placement.Request) { return func(r *placement.Request) { r.Models = m } }
func zone(z string) func(*placement.Request)      { return func(r *placement.Request) { r.Zone = z } }
func mig(p string) func(*placement.Request)       { return func(r *placement.Request) { r.MIGProfile = p } }
func nvlink(r *placement.Request)                 { r.NVLink = true }
func tee(r *placement.Request)                    { r.TEE = true }
