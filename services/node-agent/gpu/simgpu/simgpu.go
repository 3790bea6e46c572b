// Package simgpu simulates a GPU host for tests, `shizu dev` and trace
// replays. It builds go-nvml's own mock server for a catalogued profile,
// fills in the NVML calls the mocks leave unimplemented (NVLink topology,
// MIG devices, telemetry, ECC counters, events, confidential computing),
// and serves it through the real NVML backend (gpu/nvmlgpu), so the agent
// runs the same code paths as on a GPU host. Faults can be injected: an Xid
// error, ECC errors, a GPU falling off the bus, a spot interruption notice.
package simgpu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu/nvmlgpu"
)

// Xid codes the simulator knows by name.
const (
	XIDDoubleBitECC  = 48
	XIDFallenOffBus  = 79
	XIDGraphicsError = 13
)

// hgxBusIDs are the PCI buses of the eight GPUs of an HGX board.
var hgxBusIDs = []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

// Fleet is one simulated host: an nvml.Interface over the profile's mock
// server plus the fault injection controls.
type Fleet struct {
	Profile Profile
	server  *server.Server
	notices chan gpu.Notice
	events  chan nvml.EventData

	mu      sync.Mutex
	rng     *rand.Rand
	gpus    []*simGPU
	busIDs  []string
	migDevs [][]*mock.Device
}

type simGPU struct {
	dev          *server.Device
	lost         bool
	util         int
	memUsedMiB   int64
	temp         int
	powerMW      int64
	eccCorrected uint64
	eccUncorr    uint64
	nvlinkKiB    uint64
	loadMilli    int    // work the agent placed here, milli-GPU
	events       uint64 // registered event mask
}

// New builds the simulated host for profile, with GPU and MIG UUIDs (and
// the load it reports) derived from seed, so the same node id always sees
// the same GPUs.
func New(profile string, seed uint64) (*Fleet, error) {
	p, err := Lookup(profile)
	if err != nil {
		return nil, err
	}
	f := &Fleet{Profile: p, notices: make(chan gpu.Notice, 4), events: make(chan nvml.EventData, 64),
		rng: rand.New(rand.NewPCG(seed, 0x5eed))}
	s, err := server.New(server.WithGPUs(repeat(p)...), server.WithDriverVersion("550.54.15"),
		server.WithNVMLVersion("12.550.54.15"), server.WithCUDADriverVersion(12040))
	if err != nil {
		return nil, fmt.Errorf("simulated %s: %w", profile, err)
	}
	f.server = s
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.UUID = f.uuid("GPU")
		bus := i + 1
		if i < len(hgxBusIDs) {
			bus = hgxBusIDs[i]
		}
		dev.PciBusID = fmt.Sprintf("0000:%02x:00.0", bus)
		f.busIDs = append(f.busIDs, gpu.NormalizeBusID(dev.PciBusID))
		f.gpus = append(f.gpus, &simGPU{dev: dev, temp: 30, powerMW: p.IdlePowerMW})
	}
	f.migDevs = make([][]*mock.Device, len(f.gpus))
	s.SystemGetConfComputeStateFunc = f.confCompute
	s.EventSetCreateFunc = f.eventSet
	for i, g := range f.gpus {
		f.fillDevice(i, g)
	}
	for i, gis := range p.MIG {
		if err := f.partition(i, gis); err != nil {
			return nil, fmt.Errorf("simulated %s: gpu %d: %w", profile, i, err)
		}
	}
	return f, nil
}

func repeat(p Profile) []gpus.Config {
	out := make([]gpus.Config, p.Count)
	for i := range out {
		out[i] = p.GPU
	}
	return out
}

// uuid draws a UUID-shaped id from the fleet's seeded generator.
func (f *Fleet) uuid(prefix string) string {
	a, b := f.rng.Uint64(), f.rng.Uint64()
	return fmt.Sprintf("%s-%08x-%04x-%04x-%04x-%012x", prefix, a>>32, (a>>16)&0xffff, a&0xffff, b>>48, b&0xffffffffffff)
}

// Host returns the NVML backend over the simulated library, with the
// fleet's interruption notices attached.
func (f *Fleet) Host(opts ...nvmlgpu.Option) (*nvmlgpu.Backend, error) {
	return nvmlgpu.New(f.server, append([]nvmlgpu.Option{nvmlgpu.WithNotices(f.notices)}, opts...)...)
}

func (f *Fleet) confCompute() (nvml.ConfComputeSystemState, nvml.Return) {
	if !f.Profile.TEE {
		return nvml.ConfComputeSystemState{Environment: nvml.CC_SYSTEM_ENVIRONMENT_UNAVAILABLE}, nvml.SUCCESS
	}
	return nvml.ConfComputeSystemState{Environment: nvml.CC_SYSTEM_ENVIRONMENT_PROD, CcFeature: nvml.CC_SYSTEM_FEATURE_ENABLED}, nvml.SUCCESS
}

func putCString(dst []int8, s string) {
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(dst))
	clear(raw)
	copy(raw[:len(raw)-1], s)
}

// fillDevice implements the calls the mock leaves nil.
func (f *Fleet) fillDevice(i int, g *simGPU) {
	d, p := g.dev, f.Profile
	lost := func() bool { f.mu.Lock(); defer f.mu.Unlock(); return g.lost }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		if lost() {
			return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST
		}
		var pci nvml.PciInfo
		pci.PciDeviceId = p.GPU.PciDeviceId
		putCString(pci.BusId[:], "0000"+d.PciBusID) // NVML's 32-bit domain form
		return pci, nvml.SUCCESS
	}
	if len(p.GPU.MIGProfiles.GpuInstanceProfiles) == 0 {
		d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if p.Interconnect == PCIeOnly {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		if link >= p.LinksPerGPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if lost() {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		var pci nvml.PciInfo
		switch p.Interconnect {
		case NVSwitch:
			putCString(pci.BusId[:], fmt.Sprintf("00000000:%02x:00.0", 0xe0+link%p.Switches))
		case BridgePairs:
			putCString(pci.BusId[:], "0000"+f.gpus[i^1].dev.PciBusID)
		default:
			return pci, nvml.ERROR_NOT_SUPPORTED
		}
		return pci, nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if p.Interconnect == NVSwitch {
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		return nvml.NVLINK_DEVICE_TYPE_GPU, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if len(p.GPU.MIGProfiles.GpuInstanceProfiles) == 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return 7, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(idx int) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if idx < 0 || idx >= len(f.migDevs[i]) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return f.migDevs[i][idx], nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		total := d.MemoryInfo.Total
		used := uint64(g.memUsedMiB) << 20
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return nvml.Utilization{}, nvml.ERROR_GPU_IS_LOST
		}
		f.advance(g)
		return nvml.Utilization{Gpu: uint32(g.util), Memory: uint32(g.util / 2)}, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return uint32(g.temp), nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return uint32(g.powerMW), nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case g.lost:
			return 0, nvml.ERROR_GPU_IS_LOST
		case !p.ECC:
			return 0, nvml.ERROR_NOT_SUPPORTED
		case t == nvml.MEMORY_ERROR_TYPE_CORRECTED:
			return g.eccCorrected, nvml.SUCCESS
		default:
			return g.eccUncorr, nvml.SUCCESS
		}
	}
	d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		kbps := uint32(g.util) * 250 // up to ~25 MB/s
		if c == nvml.PCIE_UTIL_RX_BYTES {
			kbps *= 2
		}
		return kbps, nvml.SUCCESS
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		f.mu.Lock()
		defer f.mu.Unlock()
		if g.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		for k := range vals {
			v := &vals[k]
			switch {
			case p.Interconnect == PCIeOnly:
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			case v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX || v.FieldId == nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
				v.NvmlReturn = uint32(nvml.SUCCESS)
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
				*(*uint64)(unsafe.Pointer(&v.Value[0])) = g.nvlinkKiB
			default:
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
		eccMask := uint64(nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
		if !p.ECC && mask&eccMask != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		g.events |= mask
		return nvml.SUCCESS
	}
}

// advance moves one GPU's simulated load a step: a seeded random walk
// around the share of the GPU the agent's workloads hold (idle near 0).
func (f *Fleet) advance(g *simGPU) {
	target := min(100, g.loadMilli/10)
	g.util = min(100, max(0, g.util+(target-g.util)/2+f.rng.IntN(7)-3))
	vram := int64(f.Profile.GPU.MemoryMB)
	g.memUsedMiB = vram * int64(g.util) / 100
	g.temp = 30 + g.util/2
	g.powerMW = f.Profile.IdlePowerMW + (f.Profile.MaxPowerMW-f.Profile.IdlePowerMW)*int64(g.util)/100
	if f.Profile.Interconnect != PCIeOnly {
		g.nvlinkKiB += uint64(g.util) * 1024
	}
}

// migCI maps a GPU instance profile to the compute instance profile that
// takes all of its slices.
var migCI = map[int]int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// partition puts GPU i in MIG mode and creates the given GPU instances,
// each with one compute instance spanning it, through the mock's own MIG
// calls; each becomes a MIG device with its own UUID.
func (f *Fleet) partition(i int, giProfiles []int) error {
	d := f.gpus[i].dev
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return fmt.Errorf("enable MIG: %w", ret)
	}
	for _, gp := range giProfiles {
		info, ret := d.GetGpuInstanceProfileInfo(gp)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance profile %d: %w", gp, ret)
		}
		gi, ret := d.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("create GPU instance: %w", ret)
		}
		ciProfile, ok := migCI[gp]
		if !ok {
			return fmt.Errorf("GPU instance profile %d has no full compute instance profile", gp)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("compute instance profile %d: %w", ciProfile, ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("create compute instance: %w", ret)
		}
		giID := int(gi.(*server.GpuInstance).Info.Id)
		ciID := int(ci.(*server.ComputeInstance).Info.Id)
		mu := f.uuid("MIG")
		attrs := nvml.DeviceAttributes{GpuInstanceSliceCount: info.SliceCount, ComputeInstanceSliceCount: ciInfo.SliceCount,
			MultiprocessorCount: ciInfo.MultiprocessorCount, MemorySizeMB: info.MemorySizeMB}
		f.migDevs[i] = append(f.migDevs[i], &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return mu, nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return giID, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return ciID, nvml.SUCCESS },
			GetAttributesFunc:        func() (nvml.DeviceAttributes, nvml.Return) { return attrs, nvml.SUCCESS },
		})
	}
	sort.SliceStable(f.migDevs[i], func(a, b int) bool {
		ga, _ := f.migDevs[i][a].GetGpuInstanceId()
		gb, _ := f.migDevs[i][b].GetGpuInstanceId()
		return ga < gb
	})
	return nil
}

func (f *Fleet) eventSet() (nvml.EventSet, nvml.Return) {
	return &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
			defer t.Stop()
			select {
			case ev := <-f.events:
				return ev, nvml.SUCCESS
			case <-t.C:
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}, nvml.SUCCESS
}

func (f *Fleet) gpu(i int) (*simGPU, error) {
	if i < 0 || i >= len(f.gpus) {
		return nil, fmt.Errorf("simulated %s has no GPU %d", f.Profile.Name, i)
	}
	return f.gpus[i], nil
}

// emit queues an NVML event if the GPU is registered for it.
func (f *Fleet) emit(g *simGPU, typ uint64, data uint64) {
	f.mu.Lock()
	registered := g.events&typ != 0
	f.mu.Unlock()
	if registered {
		f.events <- nvml.EventData{Device: g.dev, EventType: typ, EventData: data}
	}
}

// AddLoad adds milli-GPU of work to the GPU with the given GPU or MIG UUID
// (negative removes it); its utilization, memory, power and NVLink traffic
// follow. An unknown UUID is ignored.
func (f *Fleet) AddLoad(uuid string, milli int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, g := range f.gpus {
		owns := g.dev.UUID == uuid
		for _, m := range f.migDevs[i] {
			if u, _ := m.GetUUID(); u == uuid {
				owns = true
			}
		}
		if owns {
			g.loadMilli = max(0, g.loadMilli+milli)
			return
		}
	}
}

var _ gpu.LoadModel = (*Fleet)(nil)

// RaiseXID makes GPU i report Xid xid. Xid 79 also takes the GPU off the
// bus, as on real hardware.
func (f *Fleet) RaiseXID(i, xid int) error {
	g, err := f.gpu(i)
	if err != nil {
		return err
	}
	if xid == XIDFallenOffBus {
		f.mu.Lock()
		g.lost = true
		f.mu.Unlock()
	}
	f.emit(g, nvml.EventTypeXidCriticalError, uint64(xid))
	return nil
}

// InjectECC adds ECC errors to GPU i's volatile counters and reports them
// as events (a double-bit error with Xid 48, as the driver does).
func (f *Fleet) InjectECC(i int, corrected, uncorrected uint64) error {
	g, err := f.gpu(i)
	if err != nil {
		return err
	}
	if !f.Profile.ECC {
		return fmt.Errorf("simulated %s has no ECC memory", f.Profile.Name)
	}
	f.mu.Lock()
	g.eccCorrected += corrected
	g.eccUncorr += uncorrected
	f.mu.Unlock()
	if corrected > 0 {
		f.emit(g, nvml.EventTypeSingleBitEccError, 0)
	}
	if uncorrected > 0 {
		f.emit(g, nvml.EventTypeDoubleBitEccError, XIDDoubleBitECC)
	}
	return nil
}

// FallOffBus makes GPU i stop answering (every call returns
// ERROR_GPU_IS_LOST) and reports Xid 79.
func (f *Fleet) FallOffBus(i int) error { return f.RaiseXID(i, XIDFallenOffBus) }

// NoticeInterruption delivers a spot interruption notice.
func (f *Fleet) NoticeInterruption(ctx context.Context, deadline time.Time, reason string) error {
	select {
	case f.notices <- gpu.Notice{Deadline: deadline, Reason: reason}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
