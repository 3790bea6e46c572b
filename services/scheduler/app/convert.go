package app

import (
	"slices"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Default host resources when a spec leaves cpu_milli or memory_mib at 0
// ("the node's default share"): per whole GPU asked, scaled for fractions.
const (
	DefaultCPUMilliPerGPU  = 4000
	DefaultMemoryMiBPerGPU = 16 * 1024
)

// requestOf translates a rental request into the placement's terms. Spot
// rentals may run on spot or on-demand nodes; on-demand and reserved ones,
// which are never interrupted, only on on-demand nodes.
func requestOf(ev *shizuv1.RentalRequested) placement.Request {
	spec := ev.GetSpec()
	r := placement.Request{
		ID: ev.GetRentalId(), Tenant: ev.GetTenantId(), Class: rent.ClassOf(spec.GetPlan()), Priority: int(spec.GetPriority()),
		GPUCount: int(spec.GetGpuCount()), MilliPerGPU: int64(spec.GetMilliGpu()), VRAMMiB: spec.GetVramMib(),
		CPUMilli: spec.GetCpuMilli(), MemoryMiB: spec.GetMemoryMib(),
		Models: spec.GetAllowedModels(), Capabilities: spec.GetRequiredCapabilities(),
		NVLink:     spec.GetInterconnect() == shizuv1.Interconnect_INTERCONNECT_NVLINK,
		MIGProfile: spec.GetMigProfile(), TEE: spec.GetTeeRequired(), Zone: spec.GetZone(),
		Market: rent.OnDemand,
	}
	if r.Class == rent.ClassSpot {
		r.Market = rent.AnyMarket
	}
	if mx := spec.GetMaxSpotPricePerGpuHour(); mx != nil {
		r.MaxSpotPrice = placement.Price{Micros: mx.GetMicros(), Currency: mx.GetCurrency()}
	}
	share := int64(r.GPUCount) * r.MilliPerGPU
	if r.CPUMilli == 0 {
		r.CPUMilli = max(1, DefaultCPUMilliPerGPU*share/placement.MilliPerGPU)
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = max(1, DefaultMemoryMiBPerGPU*share/placement.MilliPerGPU)
	}
	return r
}

// nodeOf translates a stored node into the placement's view. classes maps
// rental ids to their class and priority (for preemption); rentals it does
// not know are treated as on-demand, which nothing preempts.
func nodeOf(st *capacity.NodeState, classes map[string]ports.Class) placement.Node {
	n := placement.Node{
		ID: st.ID, Epoch: st.Epoch, Ready: st.Status == capacity.StatusReady, Zone: st.Zone,
		Market: st.Market, TEE: st.TEECapable,
		CPUMilli: st.CPUMilli, MemoryMiB: st.MemoryMiB, FreeCPUMilli: st.FreeCPUMilli, FreeMemoryMiB: st.FreeMemoryMiB,
		PricePerGPUHourMicros: st.PricePerGPUHourMicros, Currency: st.Currency,
	}
	domain := map[int]int{}
	for d, gs := range st.NVLinkDomains {
		for _, g := range gs {
			domain[g] = d
		}
	}
	total := len(st.GPUs)
	for i, g := range st.GPUs {
		d, ok := domain[i]
		if !ok {
			d = -1
		}
		pg := placement.GPU{Index: i, UUID: g.UUID, Model: g.Model, VRAMMiB: g.VRAMMiB, MIGCapable: g.MIGCapable,
			MaxSharers: g.EffectiveMaxSharers(), NVLinkDomain: d,
			// The store keeps no PCIe tree: assume two GPUs per switch and
			// half of the GPUs per NUMA node, the common 8-GPU layout.
			PCIeSwitch: i / 2, NUMA: i * 2 / max(total, 1)}
		pg.MIGEnabled = g.MIGEnabled
		for _, m := range g.MIGInstances {
			// Held until an allocation below or the free list says otherwise.
			pg.MIGInstances = append(pg.MIGInstances, placement.MIGInstance{UUID: m.UUID, Profile: m.Profile, Holder: "?"})
		}
		if i < len(st.FreeGPUs) {
			f := st.FreeGPUs[i]
			pg.FreeMilli, pg.FreeVRAMMiB, pg.Sharers, pg.MaxSharers = f.Milli, f.VRAMMiB, f.Sharers, f.MaxSharers
			pg.Unhealthy = !f.Healthy()
			for k := range pg.MIGInstances {
				if slices.Contains(f.FreeMIGInstances, pg.MIGInstances[k].UUID) {
					pg.MIGInstances[k].Holder = ""
				}
			}
		}
		n.GPUs = append(n.GPUs, pg)
	}
	for _, a := range st.Allocations {
		rec, ok := classes[a.RentalID]
		if !ok {
			rec = ports.Class{Class: rent.ClassOnDemand}
		}
		pa := placement.Allocation{RentalID: a.RentalID, Tenant: a.Tenant, Class: rec.Class, Priority: rec.Priority,
			CPUMilli: a.CPUMilli, MemoryMiB: a.MemoryMiB, Since: a.CreatedAt, MaxSpotPrice: rec.MaxSpotPrice}
		for _, g := range a.GPUs {
			pa.GPUs = append(pa.GPUs, placement.Share{Index: g.Index, Milli: g.Milli, VRAMMiB: g.VRAMMiB, MIGProfile: g.MIGProfile,
				MIGInstance: g.MIGInstance})
			if prof, ok := placement.ParseMIGProfile(g.MIGProfile); ok && g.Index < len(n.GPUs) {
				n.GPUs[g.Index].MIGSlices += prof.Slices
			}
			if g.MIGInstance != "" && g.Index < len(n.GPUs) {
				for k := range n.GPUs[g.Index].MIGInstances {
					if m := &n.GPUs[g.Index].MIGInstances[k]; m.UUID == g.MIGInstance {
						m.Holder = a.RentalID
					}
				}
			}
		}
		n.Allocations = append(n.Allocations, pa)
	}
	return n
}

// placementOf is the store's form of a decision.
func placementOf(r *placement.Request, p placement.Placement) capacity.Placement {
	cp := capacity.Placement{RentalID: r.ID, NodeID: p.NodeID, Epoch: p.Epoch, Tenant: r.Tenant,
		CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB}
	for _, s := range p.GPUs {
		cp.GPUs = append(cp.GPUs, capacity.GPUShare{Index: s.Index, Milli: s.Milli, VRAMMiB: s.VRAMMiB, MIGProfile: s.MIGProfile,
			MIGInstance: s.MIGInstance})
	}
	return cp
}

// vectorOf is the missing resource vector of a request.
func vectorOf(r *placement.Request, m placement.Missing) *shizuv1.ResourceVector {
	v := &shizuv1.ResourceVector{
		GpuCount: int32(m.GPUCount), MilliGpu: int32(m.MilliPerGPU), VramMib: m.VRAMMiB,
		CpuMilli: m.CPUMilli, MemoryMib: m.MemoryMiB, Models: r.Models, Zone: r.Zone,
		MigProfile: r.MIGProfile, Tee: r.TEE, Interconnect: shizuv1.Interconnect_INTERCONNECT_ANY,
	}
	if r.NVLink {
		v.Interconnect = shizuv1.Interconnect_INTERCONNECT_NVLINK
	}
	if r.Market == rent.OnDemand {
		v.Market = shizuv1.Market_MARKET_ON_DEMAND
	}
	return v
}
