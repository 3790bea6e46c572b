package simgpu

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
)

// The NVML backend over a simulated driver that lacks functions newer
// drivers export: the backend must not call them.
func TestFunctionsAnOlderDriverLacksAreNotCalled(t *testing.T) {
	t.Parallel()
	f, err := New("h200x8", 1) // confidential computing on
	if err != nil {
		t.Fatal(err)
	}
	srv := f.server
	srv.LookupSymbolFunc = func(symbol string) error {
		if symbol == "nvmlSystemGetConfComputeState" || symbol == "nvmlDeviceGetNvLinkRemoteDeviceType" {
			return fmt.Errorf("%s: undefined symbol", symbol)
		}
		return nil
	}
	srv.SystemGetConfComputeStateFunc = func() (nvml.ConfComputeSystemState, nvml.Return) {
		t.Error("called a function the driver does not export")
		return nvml.ConfComputeSystemState{}, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	b, err := nvmlgpu.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	inv, err := b.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if inv.TEE.Enabled || inv.TEE.Environment != "unavailable" {
		t.Fatalf("TEE = %+v", inv.TEE)
	}
	// Without the remote device type, NVSwitch links are not known as such
	// and the bus ids of the switches name no GPU: no domain is claimed.
	if len(inv.NVLinkDomains) != 0 {
		t.Fatalf("domains = %v", inv.NVLinkDomains)
	}
}
