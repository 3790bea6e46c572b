package nvmlgpu_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
)

// TestRealDriverIsReadWhenPresent runs the backend over the real NVML
// library. Without a driver, New must say so (gpu.ErrNoDriver) without
// calling anything else, which would kill the process; the test then skips.
func TestRealDriverIsReadWhenPresent(t *testing.T) {
	b, err := nvmlgpu.New(nvml.New())
	if errors.Is(err, gpu.ErrNoDriver) {
		t.Skipf("no NVIDIA driver on this host: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var out bytes.Buffer
	r, err := nvmlgpu.Probe(t.Context(), b, 200*time.Millisecond, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe:\n%s", out.String())
	if len(r.Inventory.Devices) == 0 {
		t.Fatal("a driver but no GPU")
	}
	for i, d := range r.Inventory.Devices {
		if d.UUID == "" || d.VRAMMiB <= 0 || d.Model == "" || d.PCIBusID == "" {
			t.Errorf("gpu %d read incompletely: %+v", i, d)
		}
	}
	if len(r.Samples) != 2 || len(r.Samples[1]) != len(r.Inventory.Devices) {
		t.Fatalf("samples = %v", r.Samples)
	}
}

func TestMIGProfileNamesMatchNvidiaSmi(t *testing.T) {
	t.Parallel()
	tests := []struct {
		gi, ci int
		mem    int64
		want   string
	}{
		{1, 1, 9856, "1g.10gb"},
		{3, 3, 40192, "3g.40gb"},
		{7, 7, 80000, "7g.79gb"},
		{3, 1, 40192, "1c.3g.40gb"},
		{1, 1, 4864, "1g.5gb"},
	}
	for _, tc := range tests {
		if got := nvmlgpu.MIGProfileName(tc.gi, tc.ci, tc.mem); got != tc.want {
			t.Errorf("MIGProfileName(%d, %d, %d) = %q, want %q", tc.gi, tc.ci, tc.mem, got, tc.want)
		}
	}
}
