package app

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/services/scheduler/placement"
	"github.com/shizu-gpu/shizu/shared/capacity"
)

// Default host resources when a spec leaves cpu_milli or memory_mib at 0
// ("the node's default share"): per whole GPU asked, scaled for fractions.
const (
	DefaultCPUMilliPerGPU  = 4000
	DefaultMemoryMiBPerGPU = 16 * 1024
)

// classOf maps a plan to a placement class.
func classOf(p shizuv1.Plan) placement.Class {
	switch p {
	case shizuv1.Plan_PLAN_SPOT:
		return placement.ClassSpot
	case shizuv1.Plan_PLAN_RESERVED:
		return placement.ClassReserved
	case shizuv1.Plan_PLAN_ON_DEMAND:
		return placement.ClassOnDemand
	}
	return 0
}

// requestOf translates a rental request into the placement's terms. Spot
// rentals may run on spot or on-demand nodes; on-demand and reserved ones,
// which are never interrupted, only on on-demand nodes.
func requestOf(ev *shizuv1.RentalRequested) placement.Request {
	spec := ev.GetSpec()
	r := placement.Request{
		ID: ev.GetRentalId(), Tenant: ev.GetTenantId(), Class: classOf(spec.GetPlan()), Priority: int(spec.GetPriority()),
		GPUCount: int(spec.GetGpuCount()), MilliPerGPU: int64(spec.GetMilliGpu()), VRAMMiB: spec.GetVramMib(),
		CPUMilli: spec.GetCpuMilli(), MemoryMiB: spec.GetMemoryMib(),
		Models: spec.GetAllowedModels(), Capabilities: spec.GetRequiredCapabilities(),
		NVLink:     spec.GetInterconnect() == shizuv1.Interconnect_INTERCONNECT_NVLINK,
		MIGProfile: spec.GetMigProfile(), TEE: spec.GetTeeRequired(), Zone: spec.GetZone(),
		Market: placement.MarketOnDemand,
	}
	if r.Class == placement.ClassSpot {
		r.Market = placement.MarketAny
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
func nodeOf(st *capacity.NodeState, classes map[string]classRecord) placement.Node {
	n := placement.Node{
		ID: st.ID, Epoch: st.Epoch, Ready: st.Status == capacity.StatusReady, Zone: st.Zone,
		Market: placement.Market(st.Market), TEE: st.TEECapable,
		CPUMilli: st.CPUMilli, MemoryMiB: st.MemoryMiB, FreeCPUMilli: st.FreeCPUMilli, FreeMemoryMiB: st.FreeMemoryMiB,
		PricePerGPUHourMicros: st.PricePerGPUHourMicros,
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
			rec = classRecord{Class: placement.ClassOnDemand}
		}
		pa := placement.Allocation{RentalID: a.RentalID, Tenant: a.Tenant, Class: rec.Class, Priority: rec.Priority,
			CPUMilli: a.CPUMilli, MemoryMiB: a.MemoryMiB, Since: a.CreatedAt}
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

// classRecord is what the scheduler remembers of a placed rental.
type classRecord struct {
	Class    placement.Class
	Priority int
}

func (c classRecord) String() string { return fmt.Sprintf("%d:%d", c.Class, c.Priority) }

func parseClassRecord(s string) (classRecord, bool) {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return classRecord{}, false
	}
	c, err1 := strconv.Atoi(a)
	p, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		return classRecord{}, false
	}
	return classRecord{placement.Class(c), p}, true
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

// scheduledOf builds the RentalScheduled event of an allocation (the one
// the store recorded, which for a repeated request is the first one).
func scheduledOf(ev *shizuv1.RentalRequested, a capacity.Allocation, node *nodeFacts, attempt int32, source string, now time.Time) *shizuv1.RentalScheduled {
	spec := ev.GetSpec()
	out := &shizuv1.RentalScheduled{
		Meta: &shizuv1.EventMeta{
			EventId:    fmt.Sprintf("rental:%s:scheduled:%d", ev.GetRentalId(), attempt),
			OccurredAt: timestamppb.New(now), Source: source,
			CausationId: ev.GetMeta().GetEventId(), CorrelationId: ev.GetRentalId(),
		},
		RentalId: ev.GetRentalId(), TenantId: ev.GetTenantId(), NodeId: a.NodeID, NodeEpoch: int64(a.Epoch),
		CpuMilli: a.CPUMilli, MemoryMib: a.MemoryMiB, Spec: spec, Attempt: attempt,
	}
	if node != nil {
		out.Zone = node.Zone
	}
	for _, g := range a.GPUs {
		as := &shizuv1.GpuAssignment{GpuIndex: int32(g.Index), MilliGpu: spec.GetMilliGpu(), VramMib: g.VRAMMiB}
		if node != nil && g.Index < len(node.GPUs) {
			as.GpuUuid = node.GPUs[g.Index].UUID
			out.GpuModel = node.GPUs[g.Index].Model
		}
		if g.MIGProfile != "" {
			// The instance the store gave the rental; the agent runs it there.
			as.MigInstance = &shizuv1.MigInstance{Uuid: g.MIGInstance, Profile: g.MIGProfile, VramMib: g.VRAMMiB}
		}
		out.Gpus = append(out.Gpus, as)
	}
	return out
}

func meta(id, source string, cause *shizuv1.EventMeta, correlation string, now time.Time) *shizuv1.EventMeta {
	return &shizuv1.EventMeta{EventId: id, OccurredAt: timestamppb.New(now), Source: source,
		CausationId: cause.GetEventId(), CorrelationId: correlation}
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
	if r.Market == placement.MarketOnDemand {
		v.Market = shizuv1.Market_MARKET_ON_DEMAND
	}
	return v
}

// nodeFacts is what a RentalScheduled event tells about the node it names:
// its zone and its GPUs' UUIDs and models. A value is never changed once
// built, so the goroutine that publishes a round may read it while the
// loop moves on.
type nodeFacts struct {
	Zone string
	GPUs []gpuFacts
}

type gpuFacts struct{ UUID, Model string }

func factsOf(n *placement.Node) *nodeFacts {
	f := &nodeFacts{Zone: n.Zone, GPUs: make([]gpuFacts, len(n.GPUs))}
	for i := range n.GPUs {
		f.GPUs[i] = gpuFacts{UUID: n.GPUs[i].UUID, Model: n.GPUs[i].Model}
	}
	return f
}
