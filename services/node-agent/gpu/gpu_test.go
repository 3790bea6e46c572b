package gpu_test

import (
	"slices"
	"testing"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/shared/subject"
)

func TestBusIDsCompareEqualInEitherDomainWidth(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00000000:3B:00.0":  "0000:3b:00.0",
		"0000:3b:00.0":      "0000:3b:00.0",
		" 00000001:C0:1F.7": "0001:c0:1f.7",
		"garbage":           "garbage",
	} {
		if got := gpu.NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestModelTokensNameTheProductAsPricesDo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		vram int64
		want string
	}{
		{"NVIDIA H100 80GB HBM3", 81559, "H100-SXM5-80GB"},
		{"NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"},
		{"NVIDIA H100 NVL", 95830, "H100-NVL-94GB"},
		{"NVIDIA H200", 143771, "H200-SXM5-141GB"},
		{"NVIDIA A100-SXM4-80GB", 81920, "A100-SXM4-80GB"},
		{"NVIDIA A100-PCIE-40GB", 40960, "A100-PCIE-40GB"},
		{"NVIDIA GeForce RTX 4090", 24564, "RTX4090-24GB"},
		{"Tesla T4", 15360, "TESLA-T4-15GB"},
		{"NVIDIA L40S", 46068, "L40S-45GB"},
		{"", 0, "UNKNOWN"},
	}
	for _, tc := range tests {
		got := gpu.ModelToken(tc.name, tc.vram)
		if got != tc.want {
			t.Errorf("ModelToken(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if err := subject.Token(got); err != nil {
			t.Errorf("ModelToken(%q) = %q is not a subject token: %v", tc.name, got, err)
		}
	}
}

func dev(i int, bus string, links ...gpu.NVLink) gpu.Device {
	return gpu.Device{Index: i, PCIBusID: bus, NVLinks: links}
}

func TestNVLinkDomainsFollowSwitchesAndDirectLinks(t *testing.T) {
	t.Parallel()
	sw := func(b string) gpu.NVLink { return gpu.NVLink{RemoteBusID: b, RemoteIsSwitch: true} }
	direct := func(b string) gpu.NVLink { return gpu.NVLink{RemoteBusID: b} }
	tests := []struct {
		name    string
		devs    []gpu.Device
		domains [][]int
		peers   [][]int
	}{
		{"GPUs on two NVSwitches form one domain, all peers",
			[]gpu.Device{dev(0, "0000:01:00.0", sw("0000:e0:00.0"), sw("0000:e1:00.0")), dev(1, "0000:02:00.0", sw("0000:e0:00.0")),
				dev(2, "0000:03:00.0", sw("0000:e1:00.0"))},
			[][]int{{0, 1, 2}}, [][]int{{1, 2}, {0}, {0}}},
		{"bridged pairs form two domains",
			[]gpu.Device{dev(0, "00000000:01:00.0", direct("0000:02:00.0")), dev(1, "0000:02:00.0", direct("0000:01:00.0")),
				dev(2, "0000:03:00.0", direct("0000:04:00.0")), dev(3, "0000:04:00.0", direct("0000:03:00.0"))},
			[][]int{{0, 1}, {2, 3}}, [][]int{{1}, {0}, {3}, {2}}},
		{"a chain of direct links is one domain",
			[]gpu.Device{dev(0, "0000:01:00.0", direct("0000:02:00.0")), dev(1, "0000:02:00.0", direct("0000:03:00.0")), dev(2, "0000:03:00.0")},
			[][]int{{0, 1, 2}}, [][]int{{1}, {0, 2}, {1}}},
		{"switch links whose bus id the driver does not give form one fabric",
			[]gpu.Device{dev(0, "0000:01:00.0", sw("")), dev(1, "0000:02:00.0", sw("")), dev(2, "0000:03:00.0")},
			[][]int{{0, 1}}, [][]int{{1}, {0}, {}}},
		{"PCIe-only GPUs form no domain",
			[]gpu.Device{dev(0, "0000:01:00.0"), dev(1, "0000:02:00.0")}, nil, [][]int{{}, {}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := gpu.Link(tc.devs)
			if !slices.EqualFunc(got, tc.domains, slices.Equal[[]int]) {
				t.Errorf("domains = %v, want %v", got, tc.domains)
			}
			for i, d := range tc.devs {
				if !slices.Equal(d.NVLinkPeers, tc.peers[i]) {
					t.Errorf("peers of %d = %v, want %v", i, d.NVLinkPeers, tc.peers[i])
				}
			}
		})
	}
}
