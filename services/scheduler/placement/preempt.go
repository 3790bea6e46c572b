package placement

import (
	"cmp"
	"slices"
	"time"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// maxExactVictims bounds the exhaustive search over victim sets on one
// node; above it the cheapest victims are taken greedily.
const maxExactVictims = 8

// Preemption is a plan to make room: evict Victims from node NodeID, then
// place the request there.
type Preemption struct {
	NodeID  string
	Victims []Allocation
	// LostGPUSeconds is the work the victims lose: each victim's GPUs
	// (milli/1000) times the seconds it has run.
	LostGPUSeconds float64
	// Placement is where the request goes once the victims are gone.
	Placement Placement
}

// Preemptible reports whether a rental of class victim may be evicted for
// a request of class req: only spot rentals, and only for a higher class.
func Preemptible(victim, req Class) bool { return victim == rent.ClassSpot && req > victim }

// lost is the GPU-seconds a victim loses if evicted at now.
func lost(a Allocation, now time.Time) float64 {
	if a.Since.IsZero() || !now.After(a.Since) {
		return 0
	}
	var gpus float64
	for _, s := range a.GPUs {
		gpus += float64(s.Milli) / MilliPerGPU
	}
	return gpus * now.Sub(a.Since).Seconds()
}

// PlanPreemption finds the cheapest set of spot rentals, on one node, whose
// eviction lets r fit: fewest GPU-seconds lost, then fewest victims, then
// the node the policy prefers. Only rentals Preemptible for r's class are
// candidates, so equal and higher classes are never touched. It returns
// false when no eviction makes r fit.
func (p *Placer) PlanPreemption(c *Cluster, r *Request, now time.Time) (Preemption, bool) {
	if r.Validate(p.opts.Catalogue) != nil {
		return Preemption{}, false
	}
	var best Preemption
	found := false
	one := &Cluster{Nodes: make([]Node, 1)}
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if !n.Ready || !p.staticFit(r, n, r.GPUCount) {
			continue
		}
		var victims []Allocation
		for _, a := range n.Allocations {
			if Preemptible(a.Class, r.Class) {
				victims = append(victims, a)
			}
		}
		if len(victims) == 0 {
			continue
		}
		slices.SortFunc(victims, func(a, b Allocation) int {
			return cmp.Or(cmp.Compare(lost(a, now), lost(b, now)), cmp.Compare(a.RentalID, b.RentalID))
		})
		fits := func(set []Allocation) (Placement, bool) {
			one.Nodes[0] = n.Clone()
			for _, v := range set {
				one.Nodes[0].Remove(v.RentalID)
			}
			pl, err := p.Place(one, r)
			return pl, err == nil
		}
		consider := func(set []Allocation, pl Placement) {
			cost := 0.0
			for _, v := range set {
				cost += lost(v, now)
			}
			if !found || cost < best.LostGPUSeconds || (cost == best.LostGPUSeconds && len(set) < len(best.Victims)) {
				best = Preemption{NodeID: n.ID, Victims: slices.Clone(set), LostGPUSeconds: cost, Placement: pl}
				found = true
			}
		}
		if _, ok := fits(victims); !ok {
			continue // even evicting every spot rental is not enough
		}
		if len(victims) <= maxExactVictims {
			set := make([]Allocation, 0, len(victims))
			for mask := 1; mask < 1<<len(victims); mask++ {
				set = set[:0]
				cost := 0.0
				for j, v := range victims {
					if mask&(1<<j) != 0 {
						set = append(set, v)
						cost += lost(v, now)
					}
				}
				if found && (cost > best.LostGPUSeconds || (cost == best.LostGPUSeconds && len(set) >= len(best.Victims))) {
					continue
				}
				if pl, ok := fits(set); ok {
					consider(set, pl)
				}
			}
			continue
		}
		for k := 1; k <= len(victims); k++ {
			if pl, ok := fits(victims[:k]); ok {
				consider(victims[:k], pl)
				break
			}
		}
	}
	return best, found
}

// Missing is what a request lacks to fit on the best node that could take
// it: GPUs (of its milli and VRAM), host CPU and memory.
type Missing struct {
	GPUCount    int
	MilliPerGPU int64
	VRAMMiB     int64
	CPUMilli    int64
	MemoryMiB   int64
}

// Shortage says what r is missing: over the ready nodes that pass the
// static filters, the smallest gap in usable GPUs (inside one NVLink domain
// when asked), CPU and memory. With no such node, the whole request is
// missing.
func (p *Placer) Shortage(c *Cluster, r *Request) Missing {
	s := p.shapeOf(r)
	all := Missing{GPUCount: r.GPUCount, MilliPerGPU: s.milli, VRAMMiB: s.vram, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB}
	best := all
	bestGap := -1
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if !n.Ready || !p.staticFit(r, n, 0) {
			continue
		}
		usableGPUs := 0
		perDomain := map[int]int{}
		for j := range n.GPUs {
			if _, ok := usable(&n.GPUs[j], &s); ok {
				usableGPUs++
				perDomain[n.GPUs[j].NVLinkDomain]++
			}
		}
		if r.NVLink {
			usableGPUs = 0
			for d, k := range perDomain {
				if d >= 0 {
					usableGPUs = max(usableGPUs, k)
				}
			}
		}
		m := Missing{
			GPUCount:    max(0, r.GPUCount-usableGPUs),
			MilliPerGPU: s.milli, VRAMMiB: s.vram,
			CPUMilli:  max(0, r.CPUMilli-n.FreeCPUMilli),
			MemoryMiB: max(0, r.MemoryMiB-n.FreeMemoryMiB),
		}
		gap := m.GPUCount*1_000_000 + int(m.CPUMilli/1000) + int(m.MemoryMiB/1024)
		if bestGap < 0 || gap < bestGap {
			best, bestGap = m, gap
		}
	}
	return best
}
