package agent

import (
	"errors"
	"fmt"
	"regexp"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/node-agent/gpu"
	"github.com/shizu-gpu/shizu/shared/subject"
)

// Facts are what the operator says about a node (flags), as opposed to what
// discovery finds.
type Facts struct {
	NodeID       string
	Zone         string
	Market       shizuv1.Market
	PriceMicros  int64 // per GPU-hour, on-demand
	Currency     string
	CPUMilli     int64
	MemoryMiB    int64
	InstanceType string
}

var currency = regexp.MustCompile(`^[A-Z]{3}$`)

// Validate reports every problem with the facts.
func (f Facts) Validate() error {
	var errs []error
	if err := subject.Token(f.NodeID); err != nil {
		errs = append(errs, fmt.Errorf("node id: %w", err))
	}
	if err := subject.Token(f.Zone); err != nil {
		errs = append(errs, fmt.Errorf("zone: %w", err))
	}
	if f.Market != shizuv1.Market_MARKET_ON_DEMAND && f.Market != shizuv1.Market_MARKET_SPOT {
		errs = append(errs, fmt.Errorf("market: %v is neither on-demand nor spot", f.Market))
	}
	if f.PriceMicros < 0 {
		errs = append(errs, fmt.Errorf("price: %d micros is negative", f.PriceMicros))
	}
	if !currency.MatchString(f.Currency) {
		errs = append(errs, fmt.Errorf("currency: %q is not an ISO 4217 code", f.Currency))
	}
	if f.CPUMilli <= 0 {
		errs = append(errs, fmt.Errorf("cpu: %d milli-cores, want > 0", f.CPUMilli))
	}
	if f.MemoryMiB <= 0 {
		errs = append(errs, fmt.Errorf("memory: %d MiB, want > 0", f.MemoryMiB))
	}
	return errors.Join(errs...)
}

// Describe builds the registration of a node from the operator's facts and
// the discovered inventory; epoch and meta are left for the caller, who
// gets the epoch from the capacity store. A host without GPUs is refused.
func Describe(f Facts, inv gpu.Inventory) (*shizuv1.NodeRegistered, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if len(inv.Devices) == 0 {
		return nil, errors.New("no GPU found on this host")
	}
	ev := &shizuv1.NodeRegistered{
		NodeId:          f.NodeID,
		Zone:            f.Zone,
		Market:          f.Market,
		PricePerGpuHour: &shizuv1.Money{Micros: f.PriceMicros, Currency: f.Currency},
		TeeCapable:      inv.TEE.Enabled,
		CpuMilli:        f.CPUMilli,
		MemoryMib:       f.MemoryMiB,
		InstanceType:    f.InstanceType,
		DriverVersion:   inv.DriverVersion,
	}
	for i, d := range inv.Devices {
		if d.Index != i {
			return nil, fmt.Errorf("gpu %d reports index %d", i, d.Index)
		}
		g := &shizuv1.Gpu{Index: int32(d.Index), Uuid: d.UUID, Model: d.Model, ProductName: d.ProductName,
			VramMib: d.VRAMMiB, PciBusId: d.PCIBusID, MigCapable: d.MIGCapable, MigEnabled: d.MIGEnabled, Capabilities: d.Capabilities}
		for _, p := range d.NVLinkPeers {
			g.NvlinkPeers = append(g.NvlinkPeers, int32(p))
		}
		for _, m := range d.MIG {
			g.MigInstances = append(g.MigInstances, &shizuv1.MigInstance{Uuid: m.UUID, Profile: m.Profile,
				GpuInstanceId: int32(m.GPUInstanceID), ComputeInstanceId: int32(m.ComputeInstanceID), VramMib: m.VRAMMiB})
		}
		ev.Gpus = append(ev.Gpus, g)
	}
	for _, dom := range inv.NVLinkDomains {
		d := &shizuv1.NVLinkDomain{}
		for _, i := range dom {
			d.GpuIndexes = append(d.GpuIndexes, int32(i))
		}
		ev.NvlinkDomains = append(ev.NvlinkDomains, d)
	}
	return ev, nil
}

// StoredNode is what the capacity store holds of this node.
type StoredNode struct {
	Found bool // false: the store lost the node (a flushed or replaced Redis)
	Dead  bool
	Epoch int64
}

// MustRegister reports whether the agent at epoch must register its node
// again: the store lost it, failover declared it dead, or its epoch moved
// (the node was fenced).
func MustRegister(n StoredNode, epoch int64) bool {
	return !n.Found || n.Dead || n.Epoch != epoch
}
