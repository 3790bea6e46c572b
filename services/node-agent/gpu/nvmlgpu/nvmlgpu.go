// Package nvmlgpu is the GPU backend over NVML (github.com/NVIDIA/go-nvml).
// It takes an nvml.Interface so the same code runs over the real driver
// (nvml.New()) and over go-nvml's mock servers (gpu/simgpu).
//
// NVML must not be called after a failed Init (the process dies with an
// unresolved symbol), so New initializes first and returns gpu.ErrNoDriver
// without touching anything else when the library is missing.
package nvmlgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
)

// Backend reads GPUs through NVML.
type Backend struct {
	lib     nvml.Interface
	devices []nvml.Device
	notices <-chan gpu.Notice
	now     func() time.Time

	mu     sync.Mutex
	nvlink []counterState // per device, for NVLink throughput rates
	closed bool
}

type counterState struct {
	at     time.Time
	rx, tx uint64
	ok     bool
}

// Option configures a Backend.
type Option func(*Backend)

// WithNotices attaches a source of provider interruption notices.
func WithNotices(ch <-chan gpu.Notice) Option { return func(b *Backend) { b.notices = ch } }

// WithClock sets the clock used for rates and event times.
func WithClock(now func() time.Time) Option { return func(b *Backend) { b.now = now } }

// New initializes NVML and opens every device. Without a driver it returns
// an error wrapping gpu.ErrNoDriver and makes no other NVML call.
func New(lib nvml.Interface, opts ...Option) (*Backend, error) {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION:
		return nil, fmt.Errorf("nvml init: %w: %w", ret, gpu.ErrNoDriver)
	default:
		return nil, fmt.Errorf("nvml init: %w", ret)
	}
	b := &Backend{lib: lib, now: time.Now}
	for _, o := range opts {
		o(b)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("nvml device count: %w", ret)
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			_ = lib.Shutdown()
			return nil, fmt.Errorf("nvml device %d: %w", i, ret)
		}
		b.devices = append(b.devices, d)
	}
	b.nvlink = make([]counterState, n)
	return b, nil
}

// Close shuts NVML down; it is safe to call twice.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}

// Notices returns the attached notice source (nil without one).
func (b *Backend) Notices() <-chan gpu.Notice { return b.notices }

// Discover reads the inventory.
func (b *Backend) Discover(_ context.Context) (gpu.Inventory, error) {
	var inv gpu.Inventory
	if v, ret := b.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	if v, ret := b.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDADriverVersion = v
	}
	inv.TEE = b.tee()
	for i, d := range b.devices {
		dev, err := b.describe(i, d, inv.TEE.Enabled)
		if err != nil {
			return gpu.Inventory{}, err
		}
		inv.Devices = append(inv.Devices, dev)
	}
	inv.NVLinkDomains = gpu.Link(inv.Devices)
	return inv, nil
}

// has reports whether the loaded driver exports an NVML function: calling
// one an older driver lacks kills the process like a call after a failed
// Init does.
func (b *Backend) has(symbol string) bool {
	ext := b.lib.Extensions()
	return ext != nil && ext.LookupSymbol(symbol) == nil
}

func (b *Backend) tee() gpu.TEEState {
	if !b.has("nvmlSystemGetConfComputeState") { // drivers before R535
		return gpu.TEEState{Environment: "unavailable"}
	}
	st, ret := b.lib.SystemGetConfComputeState()
	if ret != nvml.SUCCESS {
		return gpu.TEEState{Environment: "unavailable"}
	}
	env := map[uint32]string{nvml.CC_SYSTEM_ENVIRONMENT_UNAVAILABLE: "unavailable",
		nvml.CC_SYSTEM_ENVIRONMENT_SIM: "sim", nvml.CC_SYSTEM_ENVIRONMENT_PROD: "prod"}[st.Environment]
	if env == "" {
		env = fmt.Sprintf("unknown(%d)", st.Environment)
	}
	supported := st.Environment != nvml.CC_SYSTEM_ENVIRONMENT_UNAVAILABLE
	return gpu.TEEState{Supported: supported, Enabled: supported && st.CcFeature == nvml.CC_SYSTEM_FEATURE_ENABLED, Environment: env}
}

func (b *Backend) describe(i int, d nvml.Device, tee bool) (gpu.Device, error) {
	dev := gpu.Device{Index: i}
	var ret nvml.Return
	if dev.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return dev, fmt.Errorf("gpu %d uuid: %w", i, ret)
	}
	if dev.ProductName, ret = d.GetName(); ret != nvml.SUCCESS {
		return dev, fmt.Errorf("gpu %d name: %w", i, ret)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return dev, fmt.Errorf("gpu %d memory: %w", i, ret)
	}
	dev.VRAMMiB = int64(mem.Total >> 20)
	dev.Model = gpu.ModelToken(dev.ProductName, dev.VRAMMiB)
	if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
		dev.PCIBusID = gpu.NormalizeBusID(cString(pci.BusId[:]))
	}
	if arch, ret := d.GetArchitecture(); ret == nvml.SUCCESS {
		dev.Architecture = archName(arch)
	}
	major, minor, ret := d.GetCudaComputeCapability()
	if ret == nvml.SUCCESS {
		dev.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	brand, _ := d.GetBrand()
	geforce := brand == nvml.BRAND_GEFORCE || brand == nvml.BRAND_GEFORCE_RTX || brand == nvml.BRAND_NVIDIA_RTX
	if cur, _, ret := d.GetMigMode(); ret == nvml.SUCCESS {
		dev.MIGCapable = true
		dev.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
	}
	if dev.MIGEnabled {
		mig, err := migInstances(d)
		if err != nil {
			return dev, fmt.Errorf("gpu %d: %w", i, err)
		}
		dev.MIG = mig
	}
	dev.NVLinks = nvLinks(d, b.has("nvmlDeviceGetNvLinkRemoteDeviceType"))
	dev.Capabilities = gpu.Capabilities(major, minor, geforce, dev.MIGCapable, tee)
	return dev, nil
}

func nvLinks(d nvml.Device, remoteType bool) []gpu.NVLink {
	var links []gpu.NVLink
	for l := range nvml.NVLINK_MAX_LINKS {
		st, ret := d.GetNvLinkState(l)
		if ret != nvml.SUCCESS {
			break // past the last link, or NVLink not supported
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		link := gpu.NVLink{Link: l}
		if remoteType {
			if t, ret := d.GetNvLinkRemoteDeviceType(l); ret == nvml.SUCCESS {
				link.RemoteIsSwitch = t == nvml.NVLINK_DEVICE_TYPE_SWITCH
			}
		}
		pci, ret := d.GetNvLinkRemotePciInfo(l)
		switch {
		case ret == nvml.SUCCESS:
			link.RemoteBusID = gpu.NormalizeBusID(cString(pci.BusId[:]))
		case !link.RemoteIsSwitch:
			continue // a GPU link whose far end cannot be named joins nothing
		}
		// A switch without a readable bus id is the node's NVSwitch fabric
		// (gpu.Link joins every GPU linked to it).
		links = append(links, link)
	}
	return links
}

func migInstances(d nvml.Device) ([]gpu.MIGInstance, error) {
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("mig device count: %w", ret)
	}
	var out []gpu.MIGInstance
	for i := range n {
		m, ret := d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("mig device %d: %w", i, ret)
		}
		var inst gpu.MIGInstance
		if inst.UUID, ret = m.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("mig device %d uuid: %w", i, ret)
		}
		gi, _ := m.GetGpuInstanceId()
		ci, _ := m.GetComputeInstanceId()
		inst.GPUInstanceID, inst.ComputeInstanceID = gi, ci
		if attr, ret := m.GetAttributes(); ret == nvml.SUCCESS {
			inst.VRAMMiB = int64(attr.MemorySizeMB)
			inst.Profile = MIGProfileName(int(attr.GpuInstanceSliceCount), int(attr.ComputeInstanceSliceCount), int64(attr.MemorySizeMB))
		}
		out = append(out, inst)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].GPUInstanceID != out[b].GPUInstanceID {
			return out[a].GPUInstanceID < out[b].GPUInstanceID
		}
		return out[a].ComputeInstanceID < out[b].ComputeInstanceID
	})
	return out, nil
}

// MIGProfileName names a MIG slice as nvidia-smi does: "<g>g.<mem>gb",
// with "<c>c." in front when the compute instance takes fewer slices than
// its GPU instance.
func MIGProfileName(giSlices, ciSlices int, memMiB int64) string {
	name := fmt.Sprintf("%dg.%dgb", giSlices, (memMiB+1023)/1024)
	if ciSlices > 0 && ciSlices < giSlices {
		name = fmt.Sprintf("%dc.%s", ciSlices, name)
	}
	return name
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	}
	return fmt.Sprintf("arch-%d", a)
}

func cString(b []int8) string {
	if len(b) == 0 {
		return ""
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b))
	if i := slices.Index(raw, 0); i >= 0 {
		raw = raw[:i]
	}
	return strings.TrimSpace(string(raw))
}

var nvlinkFields = [2]uint32{nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX}

// Sample reads one telemetry sample per GPU. Counters NVML does not support
// on a GPU (ECC on GeForce, NVLink on PCIe cards) read as zero.
func (b *Backend) Sample(_ context.Context, into []gpu.Sample) ([]gpu.Sample, error) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return into, errors.New("nvml: backend closed")
	}
	for i, d := range b.devices {
		s := gpu.Sample{Index: i}
		util, ret := d.GetUtilizationRates()
		if ret == nvml.ERROR_GPU_IS_LOST {
			s.Lost = true
			into = append(into, s)
			continue
		}
		if ret == nvml.SUCCESS {
			s.UtilizationPercent = int(util.Gpu)
		}
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.VRAMUsedMiB = int64(mem.Used >> 20)
		}
		if t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
			s.TemperatureC = int(t)
		}
		if p, ret := d.GetPowerUsage(); ret == nvml.SUCCESS {
			s.PowerMW = int64(p)
		}
		if c, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			s.ECCCorrected = int64(c)
		}
		if u, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			s.ECCUncorrected = int64(u)
		}
		if rx, ret := d.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES); ret == nvml.SUCCESS {
			s.PCIeRxBytesPerSec = int64(rx) * 1024 // NVML reports KB/s
		}
		if tx, ret := d.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES); ret == nvml.SUCCESS {
			s.PCIeTxBytesPerSec = int64(tx) * 1024
		}
		s.NVLinkRxBytesPerSec, s.NVLinkTxBytesPerSec = b.nvlinkRates(i, d, now)
		into = append(into, s)
	}
	return into, nil
}

// nvlinkRates turns NVML's cumulative NVLink data counters (KiB, summed
// over links) into bytes per second since the previous sample.
func (b *Backend) nvlinkRates(i int, d nvml.Device, now time.Time) (rx, tx int64) {
	vals := []nvml.FieldValue{{FieldId: nvlinkFields[0], ScopeId: ^uint32(0)}, {FieldId: nvlinkFields[1], ScopeId: ^uint32(0)}}
	if ret := d.GetFieldValues(vals); ret != nvml.SUCCESS || vals[0].NvmlReturn != uint32(nvml.SUCCESS) || vals[1].NvmlReturn != uint32(nvml.SUCCESS) {
		return 0, 0
	}
	curRx := *(*uint64)(unsafe.Pointer(&vals[0].Value[0]))
	curTx := *(*uint64)(unsafe.Pointer(&vals[1].Value[0]))
	prev := b.nvlink[i]
	b.nvlink[i] = counterState{at: now, rx: curRx, tx: curTx, ok: true}
	dt := now.Sub(prev.at).Seconds()
	if !prev.ok || dt <= 0 || curRx < prev.rx || curTx < prev.tx {
		return 0, 0
	}
	return int64(float64(curRx-prev.rx) * 1024 / dt), int64(float64(curTx-prev.tx) * 1024 / dt)
}

// watchedEvents are the NVML events Watch registers for.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// Watch waits for Xid and ECC events of every GPU and sends them to out
// until ctx ends. GPUs that support only Xid events (GeForce cards have no
// ECC) are registered for those.
func (b *Backend) Watch(ctx context.Context, out chan<- gpu.Event) error {
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml event set: %w", ret)
	}
	// Freeing the set is best effort: nothing is left to do if it fails.
	defer func() { _ = set.Free() }()
	for i, d := range b.devices {
		if ret := d.RegisterEvents(watchedEvents, set); ret == nvml.SUCCESS {
			continue
		}
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return fmt.Errorf("nvml register events on gpu %d: %w", i, ret)
		}
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(200)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// Sample reports which GPU; keep waiting for the others.
			continue
		default:
			return fmt.Errorf("nvml event wait: %w", ret)
		}
		ev := gpu.Event{Index: b.indexOf(data.Device), At: b.now()}
		switch data.EventType {
		case nvml.EventTypeXidCriticalError:
			ev.Kind, ev.XID = gpu.EventXID, int(data.EventData)
		case nvml.EventTypeDoubleBitEccError:
			ev.Kind = gpu.EventECCUncorrected
		case nvml.EventTypeSingleBitEccError:
			ev.Kind = gpu.EventECCCorrected
		default:
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
		}
	}
	return nil
}

func (b *Backend) indexOf(d nvml.Device) int {
	for i, x := range b.devices {
		if x == d {
			return i
		}
	}
	if d != nil {
		if uuid, ret := d.GetUUID(); ret == nvml.SUCCESS {
			for i, x := range b.devices {
				if u, _ := x.GetUUID(); u == uuid {
					return i
				}
			}
		}
	}
	return -1
}

var _ gpu.Host = (*Backend)(nil)
