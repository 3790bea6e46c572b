package capacity_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

func TestNodeValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(n *capacity.Node)
		want   []string // every one must appear in the error; none means valid
	}{
		{"the default fixture is valid", func(*capacity.Node) {}, nil},
		{"a spot node without labels or NVLink is valid", func(n *capacity.Node) {
			n.Market, n.Labels, n.NVLinkDomains = capacity.MarketSpot, nil, nil
		}, nil},
		{"an id with a brace is refused, so it cannot break the hash tag", func(n *capacity.Node) { n.ID = "n{1}" }, []string{"ID:"}},
		{"an empty id, zone and market are all reported together", func(n *capacity.Node) {
			n.ID, n.Zone, n.Market = "", "", ""
		}, []string{"ID: must not be empty", "Zone: must not be empty", "Market:"}},
		{"a lower-case currency is refused", func(n *capacity.Node) { n.Currency = "usd" }, []string{"Currency:"}},
		{"a negative price is refused", func(n *capacity.Node) { n.PricePerGPUHourMicros = -1 }, []string{"PricePerGPUHourMicros:"}},
		{"no host CPU or memory is refused", func(n *capacity.Node) { n.CPUMilli, n.MemoryMiB = 0, 0 }, []string{"CPUMilli:", "MemoryMiB:"}},
		{"a node without GPUs is refused", func(n *capacity.Node) { n.GPUs, n.NVLinkDomains = nil, nil }, []string{"GPUs:"}},
		{"GPU indexes out of order are refused", func(n *capacity.Node) { n.GPUs[1].Index = 3 }, []string{"GPUs[1].Index:"}},
		{"two GPUs with one UUID are refused", func(n *capacity.Node) { n.GPUs[1].UUID = n.GPUs[0].UUID }, []string{"GPUs[1].UUID:"}},
		{"a GPU without VRAM or model is refused", func(n *capacity.Node) {
			n.GPUs[0].VRAMMiB, n.GPUs[0].Model = 0, ""
		}, []string{"GPUs[0].VRAMMiB:", "GPUs[0].Model:"}},
		{"a negative sharer limit is refused", func(n *capacity.Node) { n.GPUs[0].MaxSharers = -1 }, []string{"GPUs[0].MaxSharers:"}},
		{"an NVLink peer that does not exist is refused", func(n *capacity.Node) {
			n.GPUs[0].NVLinkPeers = []int{0, 9}
		}, []string{"GPUs[0].NVLinkPeers[0]: a GPU is not its own peer", "GPUs[0].NVLinkPeers[1]: GPU 9 does not exist"}},
		{"a GPU in two NVLink domains is refused", func(n *capacity.Node) {
			n.NVLinkDomains = [][]int{{0, 1}, {1}}
		}, []string{"NVLinkDomains[1]: GPU 1 is already in NVLinkDomains[0]"}},
		{"an empty label key is refused", func(n *capacity.Node) { n.Labels = map[string]string{"": "x"} }, []string{"Labels:"}},
		{"a GPU in MIG mode with its instances is valid", func(n *capacity.Node) {
			n.GPUs[1].MIGEnabled = true
			n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-a", Profile: "1g.10gb", VRAMMiB: 9856}, {UUID: "MIG-b", Profile: "3g.40gb"}}
		}, nil},
		{"MIG mode on a GPU that is not MIG-capable is refused", func(n *capacity.Node) {
			n.GPUs[1].MIGCapable, n.GPUs[1].MIGEnabled = false, true
		}, []string{"GPUs[1].MIGEnabled:"}},
		{"MIG instances on a GPU not in MIG mode are refused", func(n *capacity.Node) {
			n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-a", Profile: "1g.10gb"}}
		}, []string{"GPUs[1].MIGInstances:"}},
		{"MIG instances without UUID or profile, or sharing a UUID, are refused", func(n *capacity.Node) {
			n.GPUs[0].MIGEnabled, n.GPUs[1].MIGEnabled = true, true
			n.GPUs[0].MIGInstances = []capacity.MIGInstance{{UUID: "", Profile: "1g.10gb"}, {UUID: "MIG-a", Profile: ""}}
			n.GPUs[1].MIGInstances = []capacity.MIGInstance{{UUID: "MIG-a", Profile: "1g.10gb"}}
		}, []string{"GPUs[0].MIGInstances[0].UUID:", "GPUs[0].MIGInstances[1].Profile:", "GPUs[1].MIGInstances[0].UUID:"}},
		{"more MIG instances than a GPU can have are refused (Register would fail half-way in Lua)", func(n *capacity.Node) {
			n.GPUs[1].MIGEnabled = true
			for k := range capacity.MaxMIGInstances + 1 {
				n.GPUs[1].MIGInstances = append(n.GPUs[1].MIGInstances, capacity.MIGInstance{UUID: fmt.Sprintf("MIG-%d", k), Profile: "1g.10gb"})
			}
		}, []string{"GPUs[1].MIGInstances: 8 instances; a GPU has at most 7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := gpuNode("n1", 2)
			tt.mutate(&n)
			checkProblems(t, n.Validate(), tt.want)
		})
	}
}

func TestPlacementValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(p *capacity.Placement)
		want   []string
	}{
		{"the default fixture is valid", func(*capacity.Placement) {}, nil},
		{"a MIG slice without host CPU is valid", func(p *capacity.Placement) {
			p.CPUMilli, p.MemoryMiB = 0, 0
			p.GPUs = []capacity.GPUShare{{Index: 3, Milli: 142, VRAMMiB: 10240, MIGProfile: "1g.10gb", MIGInstance: "MIG-1"}}
		}, nil},
		{"a MIG slice without its instance is refused", func(p *capacity.Placement) {
			p.GPUs = []capacity.GPUShare{{Index: 3, Milli: 142, VRAMMiB: 10240, MIGProfile: "1g.10gb"}}
		}, []string{"GPUs[0].MIGInstance:"}},
		{"an instance without its profile is refused", func(p *capacity.Placement) {
			p.GPUs = []capacity.GPUShare{{Index: 3, Milli: 142, VRAMMiB: 10240, MIGInstance: "MIG-1"}}
		}, []string{"GPUs[0].MIGInstance:"}},
		{"missing ids, epoch and tenant are all reported together", func(p *capacity.Placement) {
			p.RentalID, p.NodeID, p.Epoch, p.Tenant = "", "", 0, ""
		}, []string{"RentalID:", "NodeID:", "Epoch:", "Tenant:"}},
		{"a rental id with a space is refused", func(p *capacity.Placement) { p.RentalID = "r 1" }, []string{"RentalID:"}},
		{"negative host resources are refused", func(p *capacity.Placement) { p.CPUMilli, p.MemoryMiB = -1, -1 }, []string{"CPUMilli:", "MemoryMiB:"}},
		{"a placement without GPUs is refused", func(p *capacity.Placement) { p.GPUs = nil }, []string{"GPUs:"}},
		{"zero and over-full milli are refused", func(p *capacity.Placement) {
			p.GPUs = []capacity.GPUShare{share(0, 0, 1), share(1, 1001, 1)}
		}, []string{"GPUs[0].Milli:", "GPUs[1].Milli:"}},
		{"the same GPU twice is refused", func(p *capacity.Placement) {
			p.GPUs = []capacity.GPUShare{share(0, 100, 1), share(0, 100, 1)}
		}, []string{"GPUs[1].Index: GPU 0 is also GPUs[0]"}},
		{"a negative GPU index and VRAM are refused", func(p *capacity.Placement) {
			p.GPUs = []capacity.GPUShare{share(-1, 100, -5)}
		}, []string{"GPUs[0].Index:", "GPUs[0].VRAMMiB:"}},
		{"absurd quantities are refused before they reach Lua", func(p *capacity.Placement) {
			p.MemoryMiB = capacity.MaxQuantity + 1
		}, []string{"MemoryMiB:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := place("r1", "n1", 1, share(0, 500, 40960), share(1, 1000, 81920))
			tt.mutate(&p)
			checkProblems(t, p.Validate(), tt.want)
		})
	}
}

// checkProblems asserts err is nil when want is empty, else an invalid-input
// error that names every wanted problem.
func checkProblems(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("want valid, got %v", err)
		}
		return
	}
	if !capacity.IsInvalid(err) {
		t.Fatalf("want an invalid-input error, got %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q:\n%v", w, err)
		}
	}
}
