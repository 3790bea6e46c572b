package simgpu_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/simgpu"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
	"github.com/shizu-gpu/shizu/shared/subject"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func open(t *testing.T, profile string, seed uint64) (*simgpu.Fleet, gpu.Host) {
	t.Helper()
	f, err := simgpu.New(profile, seed)
	if err != nil {
		t.Fatal(err)
	}
	h, err := f.Host()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return f, h
}

func TestDiscoveryReportsEachProfileAsTheRealHardware(t *testing.T) {
	t.Parallel()
	all8 := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	tests := []struct {
		profile  string
		count    int
		model    string
		product  string
		vramMiB  int64
		domains  [][]int
		peersOf0 []int
		migCap   bool
		mig      map[int][]string
		tee      bool
		caps     []string
		notCaps  []string
	}{
		{profile: "h100x8", count: 8, model: "H100-SXM5-80GB", product: "NVIDIA H100 80GB HBM3", vramMiB: 81920,
			domains: all8, peersOf0: []int{1, 2, 3, 4, 5, 6, 7}, migCap: true, caps: []string{"fp8", "bf16", "mig"}},
		{profile: "h100x8-mig", count: 8, model: "H100-SXM5-80GB", vramMiB: 81920, domains: all8,
			peersOf0: []int{1, 2, 3, 4, 5, 6, 7}, migCap: true,
			mig: map[int][]string{6: {"3g.40gb", "2g.20gb", "2g.20gb"}, 7: slices.Repeat([]string{"1g.10gb"}, 7)}},
		{profile: "a100x8", count: 8, model: "A100-SXM4-80GB", product: "NVIDIA A100-SXM4-80GB", vramMiB: 81920,
			domains: all8, peersOf0: []int{1, 2, 3, 4, 5, 6, 7}, migCap: true, caps: []string{"bf16", "tf32"}, notCaps: []string{"fp8"}},
		{profile: "a100pcie4", count: 4, model: "A100-PCIE-40GB", product: "NVIDIA A100-PCIE-40GB", vramMiB: 40960,
			domains: [][]int{{0, 1}, {2, 3}}, peersOf0: []int{1}, migCap: true},
		{profile: "rtx4090x8", count: 8, model: "RTX4090-24GB", product: "NVIDIA GeForce RTX 4090", vramMiB: 24564,
			domains: nil, peersOf0: []int{}, migCap: false, caps: []string{"fp8", "rt-cores"}, notCaps: []string{"mig"}},
		{profile: "h200x8", count: 8, model: "H200-SXM5-141GB", product: "NVIDIA H200 141GB HBM3e", vramMiB: 144384,
			domains: all8, peersOf0: []int{1, 2, 3, 4, 5, 6, 7}, migCap: true, tee: true, caps: []string{"cc"}},
	}
	if got := len(tests); got != len(simgpu.Profiles()) {
		t.Fatalf("test covers %d profiles, catalogue has %d: %v", got, len(simgpu.Profiles()), simgpu.Profiles())
	}
	for _, tc := range tests {
		t.Run(tc.profile+" is discovered with its GPUs, memory, NVLink domains and MIG instances", func(t *testing.T) {
			t.Parallel()
			_, h := open(t, tc.profile, 1)
			inv, err := h.Discover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Devices) != tc.count {
				t.Fatalf("devices = %d, want %d", len(inv.Devices), tc.count)
			}
			if !slices.EqualFunc(inv.NVLinkDomains, tc.domains, slices.Equal[[]int]) {
				t.Errorf("NVLink domains = %v, want %v", inv.NVLinkDomains, tc.domains)
			}
			if inv.TEE.Enabled != tc.tee {
				t.Errorf("TEE enabled = %v, want %v", inv.TEE.Enabled, tc.tee)
			}
			if inv.DriverVersion == "" {
				t.Error("no driver version")
			}
			seen := map[string]bool{}
			for i, d := range inv.Devices {
				if d.Index != i || d.Model != tc.model || d.VRAMMiB != tc.vramMiB || d.MIGCapable != tc.migCap {
					t.Errorf("gpu %d = index %d model %q vram %d mig %v; want model %q vram %d mig %v",
						i, d.Index, d.Model, d.VRAMMiB, d.MIGCapable, tc.model, tc.vramMiB, tc.migCap)
				}
				if tc.product != "" && d.ProductName != tc.product {
					t.Errorf("gpu %d product = %q, want %q", i, d.ProductName, tc.product)
				}
				if err := subject.Token(d.Model); err != nil {
					t.Errorf("model token: %v", err)
				}
				if seen[d.UUID] || seen[d.PCIBusID] {
					t.Errorf("gpu %d repeats a UUID or bus id: %s %s", i, d.UUID, d.PCIBusID)
				}
				seen[d.UUID], seen[d.PCIBusID] = true, true
				var profiles []string
				for _, m := range d.MIG {
					profiles = append(profiles, m.Profile)
					if seen[m.UUID] || len(m.UUID) < 5 || m.UUID[:4] != "MIG-" || m.VRAMMiB <= 0 {
						t.Errorf("gpu %d MIG instance %+v", i, m)
					}
					seen[m.UUID] = true
				}
				if !slices.Equal(profiles, tc.mig[i]) {
					t.Errorf("gpu %d MIG profiles = %v, want %v", i, profiles, tc.mig[i])
				}
				if d.MIGEnabled != (len(tc.mig[i]) > 0) {
					t.Errorf("gpu %d MIG enabled = %v", i, d.MIGEnabled)
				}
				for _, c := range tc.caps {
					if !slices.Contains(d.Capabilities, c) {
						t.Errorf("gpu %d capabilities %v lack %q", i, d.Capabilities, c)
					}
				}
				for _, c := range tc.notCaps {
					if slices.Contains(d.Capabilities, c) {
						t.Errorf("gpu %d capabilities %v have %q", i, d.Capabilities, c)
					}
				}
			}
			if got := inv.Devices[0].NVLinkPeers; !slices.Equal(got, tc.peersOf0) && !(len(got) == 0 && len(tc.peersOf0) == 0) {
				t.Errorf("NVLink peers of gpu 0 = %v, want %v", got, tc.peersOf0)
			}
		})
	}
}

// uuids are the GPU UUIDs by index of a fleet of profile and seed, as
// discovery reports them.
func uuids(t *testing.T, profile string, seed uint64) []string {
	t.Helper()
	_, h := open(t, profile, seed)
	inv, err := h.Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range inv.Devices {
		out = append(out, d.UUID)
	}
	return out
}

func TestTheSameSeedSeesTheSameGPUs(t *testing.T) {
	t.Parallel()
	a, b, c := uuids(t, "h100x8", 7), uuids(t, "h100x8", 7), uuids(t, "h100x8", 8)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different UUIDs")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same UUIDs")
	}
}

func TestUnknownProfileNamesTheKnownOnes(t *testing.T) {
	t.Parallel()
	_, err := simgpu.New("tpu-v5", 1)
	if err == nil || !strings.Contains(err.Error(), "h100x8") {
		t.Fatalf("err = %v, want it to list the catalogue", err)
	}
}

func TestSamplesFollowTheWorkPlacedOnEachGPU(t *testing.T) {
	t.Parallel()
	f, h := open(t, "h100x8", 3)
	ids := uuids(t, "h100x8", 3) // the same seed sees the same GPUs
	f.AddLoad(ids[0], 1000)
	f.AddLoad(ids[1], 500)
	f.AddLoad("GPU-unknown", 1000) // ignored
	var samples []gpu.Sample
	var err error
	for range 10 {
		if samples, err = h.Sample(t.Context(), samples[:0]); err != nil {
			t.Fatal(err)
		}
	}
	if len(samples) != 8 {
		t.Fatalf("samples = %d", len(samples))
	}
	for _, s := range samples {
		if s.Lost || s.TemperatureC <= 0 || s.PowerMW <= 0 || s.UtilizationPercent < 0 || s.UtilizationPercent > 100 {
			t.Errorf("sample %+v", s)
		}
	}
	full, half, idle := samples[0], samples[1], samples[7]
	if full.UtilizationPercent < 90 || half.UtilizationPercent < 40 || half.UtilizationPercent > 60 || idle.UtilizationPercent > 10 {
		t.Errorf("utilization full/half/idle = %d/%d/%d", full.UtilizationPercent, half.UtilizationPercent, idle.UtilizationPercent)
	}
	if full.NVLinkRxBytesPerSec <= 0 || full.PowerMW <= idle.PowerMW || full.VRAMUsedMiB <= idle.VRAMUsedMiB {
		t.Errorf("a busy GPU looks idle: %+v vs %+v", full, idle)
	}
	f.AddLoad(ids[0], -1000)
	for range 10 {
		samples, _ = h.Sample(t.Context(), samples[:0])
	}
	if samples[0].UtilizationPercent > 10 {
		t.Errorf("utilization after the work left = %d", samples[0].UtilizationPercent)
	}
}

func TestInjectedFaultsAreReportedAsTheDriverWould(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		inject func(f *simgpu.Fleet) error
		want   gpu.Event
		lost   bool
		uncorr int64
	}{
		{name: "an Xid is reported with its code", inject: func(f *simgpu.Fleet) error { return f.RaiseXID(2, 31) },
			want: gpu.Event{Index: 2, Kind: gpu.EventXID, XID: 31}},
		{name: "an uncorrected ECC error is reported and counted", inject: func(f *simgpu.Fleet) error { return f.InjectECC(3, 0, 2) },
			want: gpu.Event{Index: 3, Kind: gpu.EventECCUncorrected}, uncorr: 2},
		{name: "a GPU falling off the bus raises Xid 79 and stops answering", inject: func(f *simgpu.Fleet) error { return f.FallOffBus(5) },
			want: gpu.Event{Index: 5, Kind: gpu.EventXID, XID: 79}, lost: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, h := open(t, "h100x8", 11)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			events := make(chan gpu.Event, 4)
			done := make(chan error, 1)
			go func() { done <- h.Watch(ctx, events) }()
			// Watch registers asynchronously; inject until an event arrives.
			var got gpu.Event
			testkit.Eventually(t, 10*time.Second, func() error {
				if err := tc.inject(f); err != nil {
					t.Fatal(err)
				}
				select {
				case got = <-events:
					return nil
				default:
					return errors.New("no event yet")
				}
			})
			got.At = time.Time{}
			if got != tc.want {
				t.Errorf("event = %+v, want %+v", got, tc.want)
			}
			samples, err := h.Sample(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := samples[tc.want.Index]
			if s.Lost != tc.lost || (tc.uncorr > 0 && s.ECCUncorrected < tc.uncorr) {
				t.Errorf("sample after fault = %+v", s)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestGeForceHasNoECCToInject(t *testing.T) {
	t.Parallel()
	f, _ := open(t, "rtx4090x8", 1)
	if err := f.InjectECC(0, 1, 1); err == nil {
		t.Fatal("ECC injected into a GeForce card")
	}
}

func TestInterruptionNoticeIsDelivered(t *testing.T) {
	t.Parallel()
	f, h := open(t, "h100x8", 1)
	deadline := time.Date(2026, 11, 30, 15, 0, 0, 0, time.UTC)
	if err := f.NoticeInterruption(t.Context(), deadline, "spot reclaim"); err != nil {
		t.Fatal(err)
	}
	n := <-h.Notices()
	if !n.Deadline.Equal(deadline) || n.Reason != "spot reclaim" {
		t.Fatalf("notice = %+v", n)
	}
}

// Every simulated model must be one the scheduler and metering know, or its
// rentals could neither be placed by model nor priced.
func TestEveryProfileReportsAModelTheCatalogueKnows(t *testing.T) {
	t.Parallel()
	for _, profile := range simgpu.Profiles() {
		_, h := open(t, profile, 1)
		inv, err := h.Discover(t.Context())
		if err != nil {
			t.Fatalf("%s: %v", profile, err)
		}
		for _, d := range inv.Devices {
			if _, ok := gpumodel.Lookup(d.Model); !ok {
				t.Errorf("profile %s: unknown GPU model %q", profile, d.Model)
			}
			if m, _ := gpumodel.Lookup(d.Model); m.VRAMMiB != 0 && d.Model != "" && abs(m.VRAMMiB-d.VRAMMiB) > m.VRAMMiB/20 {
				t.Errorf("profile %s: %s has %d MiB, the catalogue says %d", profile, d.Model, d.VRAMMiB, m.VRAMMiB)
			}
		}
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
