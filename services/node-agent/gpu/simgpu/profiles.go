package simgpu

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// Interconnect is how a profile's GPUs are wired.
type Interconnect int

// Interconnects.
const (
	// PCIeOnly: no NVLink at all (GeForce cards).
	PCIeOnly Interconnect = iota
	// NVSwitch: every GPU has LinksPerGPU NVLinks spread over Switches
	// NVSwitches (HGX/DGX boards), so all GPUs form one domain.
	NVSwitch
	// BridgePairs: NVLink bridges join GPUs 0-1, 2-3, ... (PCIe cards).
	BridgePairs
)

// Profile describes one kind of GPU host faithfully enough that discovery,
// placement and billing see what the real machine would report.
type Profile struct {
	Name         string
	Description  string
	InstanceType string
	GPU          gpus.Config
	Count        int
	Interconnect Interconnect
	LinksPerGPU  int
	Switches     int
	// MIG lists, per GPU index, the GPU instance profiles
	// (nvml.GPU_INSTANCE_PROFILE_*) to create at start; those GPUs run in
	// MIG mode.
	MIG map[int][]int
	// TEE: confidential computing is on (CC_SYSTEM_FEATURE_ENABLED).
	TEE bool
	// ECC: the GPU has ECC memory (datacenter parts); GeForce has none.
	ECC bool
	// Host resources rentals may use.
	CPUMilli  int64
	MemoryMiB int64
	// Power draw range, milliwatts.
	IdlePowerMW, MaxPowerMW int64
}

// rtx4090 is the GeForce RTX 4090 as NVML reports it (the mock packages
// ship only datacenter parts).
var rtx4090 = gpus.Config{
	Name:         "NVIDIA GeForce RTX 4090",
	Architecture: nvml.DEVICE_ARCH_ADA,
	Brand:        nvml.BRAND_GEFORCE,
	MemoryMB:     24564,
	CudaMajor:    8,
	CudaMinor:    9,
	PciDeviceId:  0x268410DE,
}

// catalogue is every profile, by name.
var catalogue = map[string]Profile{
	"h100x8": {Name: "h100x8", Description: "8x H100 SXM5 80GB, full NVLink through 4 NVSwitches (HGX H100)",
		InstanceType: "p5.48xlarge", GPU: gpus.H100_SXM5_80GB, Count: 8, Interconnect: NVSwitch, LinksPerGPU: 18, Switches: 4,
		ECC: true, CPUMilli: 180_000, MemoryMiB: 1_900_000, IdlePowerMW: 70_000, MaxPowerMW: 700_000},
	"h100x8-mig": {Name: "h100x8-mig", Description: "8x H100 SXM5 80GB with GPU 6 as 3g.40gb+2x2g.20gb and GPU 7 as 7x1g.10gb",
		InstanceType: "p5.48xlarge", GPU: gpus.H100_SXM5_80GB, Count: 8, Interconnect: NVSwitch, LinksPerGPU: 18, Switches: 4,
		MIG: map[int][]int{
			6: {nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE},
			7: slices.Repeat([]int{nvml.GPU_INSTANCE_PROFILE_1_SLICE}, 7),
		},
		ECC: true, CPUMilli: 180_000, MemoryMiB: 1_900_000, IdlePowerMW: 70_000, MaxPowerMW: 700_000},
	"a100x8": {Name: "a100x8", Description: "8x A100 SXM4 80GB, full NVLink through 6 NVSwitches (HGX A100)",
		InstanceType: "p4de.24xlarge", GPU: gpus.A100_SXM4_80GB, Count: 8, Interconnect: NVSwitch, LinksPerGPU: 12, Switches: 6,
		ECC: true, CPUMilli: 90_000, MemoryMiB: 1_100_000, IdlePowerMW: 60_000, MaxPowerMW: 400_000},
	"a100pcie4": {Name: "a100pcie4", Description: "4x A100 PCIe 40GB, NVLink bridges joining GPUs in pairs",
		InstanceType: "a100-pcie-4", GPU: gpus.A100_PCIE_40GB, Count: 4, Interconnect: BridgePairs, LinksPerGPU: 12,
		ECC: true, CPUMilli: 60_000, MemoryMiB: 480_000, IdlePowerMW: 35_000, MaxPowerMW: 250_000},
	"rtx4090x8": {Name: "rtx4090x8", Description: "8x GeForce RTX 4090 24GB on PCIe, no NVLink, no ECC, no MIG",
		InstanceType: "rtx4090-8", GPU: rtx4090, Count: 8, Interconnect: PCIeOnly,
		CPUMilli: 60_000, MemoryMiB: 480_000, IdlePowerMW: 20_000, MaxPowerMW: 450_000},
	"h200x8": {Name: "h200x8", Description: "8x H200 SXM5 141GB, full NVLink through 4 NVSwitches, confidential computing on",
		InstanceType: "p5e.48xlarge", GPU: gpus.H200_SXM5_141GB, Count: 8, Interconnect: NVSwitch, LinksPerGPU: 18, Switches: 4,
		TEE: true, ECC: true, CPUMilli: 180_000, MemoryMiB: 1_900_000, IdlePowerMW: 75_000, MaxPowerMW: 700_000},
}

// Profiles lists the catalogue's profile names, sorted.
func Profiles() []string {
	names := make([]string, 0, len(catalogue))
	for n := range catalogue {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Lookup returns the named profile.
func Lookup(name string) (Profile, error) {
	p, ok := catalogue[name]
	if !ok {
		return Profile{}, fmt.Errorf("unknown simulated profile %q (known: %s)", name, strings.Join(Profiles(), ", "))
	}
	return p, nil
}
