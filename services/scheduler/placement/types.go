package placement

import (
	"slices"
	"time"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// MilliPerGPU is the capacity of one GPU in milli-GPU.
const MilliPerGPU = 1000

// DefaultMaxSharers is how many rentals may share one GPU when GPU.MaxSharers
// is 0: the level below which time-slicing costs under 8 % of FP32 throughput.
const DefaultMaxSharers = 4

// Class is a rental's pricing class (shared/rent's); higher classes are
// placed first and never preempted by lower ones.
type Class = rent.Class

// Market is how a node is bought from its provider (shared/rent's);
// rent.AnyMarket in a request means either.
type Market = rent.Market

// Cluster is what the placement sees: every node with its free capacity.
type Cluster struct {
	Nodes []Node
}

// Node is one GPU host as the scheduler sees it.
type Node struct {
	ID     string
	Epoch  uint64
	Ready  bool
	Zone   string
	Market Market
	TEE    bool
	// TieRank orders nodes whose scores are equal (lower wins); nodes with
	// the same TieRank are ordered by a hash of request and node id.
	TieRank       uint64
	CPUMilli      int64
	MemoryMiB     int64
	FreeCPUMilli  int64
	FreeMemoryMiB int64
	GPUs          []GPU // GPUs[i].Index == i
	// Allocations are the rentals on the node (used by preemption and by
	// packing scores); they are already deducted from the free capacity.
	Allocations []Allocation
	// PricePerGPUHourMicros is the node's list price per GPU-hour, in
	// micro-units of Currency, as its agent registered it.
	PricePerGPUHourMicros int64
	Currency              string
	// SpotPrice is the spot price in force on the node now; the zero Price
	// means none is known, and a spot rental pays the list price
	// (PricePerGPUHourMicros), as metering bills it then.
	SpotPrice Price
}

// Price is an amount per GPU-hour in integer micro-units of Currency.
type Price struct {
	Micros   int64
	Currency string
}

// Known reports whether p is a price (it names its currency).
func (p Price) Known() bool { return p.Currency != "" }

// CurrentSpotPrice is what a spot rental pays per GPU-hour on the node
// now: its SpotPrice, else its list price; the zero Price when the node
// names neither.
func (n *Node) CurrentSpotPrice() Price {
	if n.SpotPrice.Known() {
		return n.SpotPrice
	}
	if n.Currency == "" {
		return Price{}
	}
	return Price{Micros: n.PricePerGPUHourMicros, Currency: n.Currency}
}

// GPU is one device of a node and its free capacity. The fields read on
// every decision come first, so a scan touches one cache line per GPU.
type GPU struct {
	// FreeMilli and FreeVRAMMiB are what no rental holds.
	FreeMilli   int64
	FreeVRAMMiB int64
	// Sharers is the number of rentals on the GPU; MaxSharers its limit
	// (0 = DefaultMaxSharers).
	Sharers    int
	MaxSharers int
	// MIGSlices is the number of MIG compute slices (of 7) in use; a GPU
	// with MIG slices takes only MIG rentals, and one time-shared by
	// non-MIG rentals takes no MIG rental.
	MIGSlices  int
	VRAMMiB    int64
	Index      int
	MIGCapable bool
	// Unhealthy: the GPU was reported degraded or failed; it takes no new
	// rental.
	Unhealthy bool
	// MIGEnabled: the GPU is in MIG mode. It takes only MIG rentals, each
	// on a free instance of its profile in MIGInstances, and nothing
	// time-shared or whole.
	MIGEnabled   bool
	MIGInstances []MIGInstance
	// NVLinkDomain is the index of the GPU's NVLink domain on its node, -1
	// for none.
	NVLinkDomain int
	// PCIeSwitch and NUMA locate the GPU on the host's PCIe tree; GPUs on
	// one switch are 1 hop apart, on one NUMA node 2, otherwise 3.
	PCIeSwitch int
	NUMA       int
	UUID       string
	Model      string
}

// EffectiveMaxSharers is MaxSharers with the default applied.
func (g GPU) EffectiveMaxSharers() int {
	if g.MaxSharers <= 0 {
		return DefaultMaxSharers
	}
	return g.MaxSharers
}

// Whole reports whether nobody uses the GPU.
func (g GPU) Whole() bool {
	return g.FreeMilli == MilliPerGPU && g.FreeVRAMMiB == g.VRAMMiB && g.Sharers == 0
}

// Allocation is a rental placed on a node.
type Allocation struct {
	RentalID  string
	Tenant    string
	Class     Class
	Priority  int
	CPUMilli  int64
	MemoryMiB int64
	GPUs      []Share
	// Since is when the allocation was made; preemption counts the
	// GPU-seconds a victim would lose from it.
	Since time.Time
	// MaxSpotPrice is the spot rental's maximum price (the zero Price:
	// none known); a price rise above it interrupts the rental.
	MaxSpotPrice Price
}

// MIGInstance is one configured MIG instance of a GPU in MIG mode.
type MIGInstance struct {
	UUID    string
	Profile string
	// Holder is the rental on the instance; empty when it is free.
	Holder string
}

// Share is the part of one GPU a placement takes. A MIG share names the
// instance (MIGInstance, its UUID) it runs on.
type Share struct {
	Index       int
	Milli       int64
	VRAMMiB     int64
	MIGProfile  string
	MIGInstance string
}

// Request is one rental to place, in the scheduler's own terms.
type Request struct {
	ID       string
	Tenant   string
	Class    Class
	Priority int
	// GPUCount GPUs of MilliPerGPU milli-GPU each; a fraction (< 1000) only
	// with GPUCount 1.
	GPUCount    int
	MilliPerGPU int64
	// VRAMMiB per GPU; 0 means none in particular (a whole GPU comes with
	// all its memory).
	VRAMMiB   int64
	CPUMilli  int64
	MemoryMiB int64
	// Models allowed (empty = any), capabilities every GPU must have.
	Models       []string
	Capabilities []string
	// PreferredModels are not a filter: among the nodes that pass every
	// filter, one whose GPUs are of a preferred model ranks above every
	// other, whatever the policy's score (a moved rental prefers the model
	// it ran on). Empty: no preference.
	PreferredModels []string
	NVLink          bool
	MIGProfile      string
	TEE             bool
	Zone            string
	Market          Market
	// MaxSpotPrice is the most a spot rental pays per GPU-hour; the zero
	// Price is no cap. A capped rental is placed only on a node whose
	// current spot price is known, in its currency, and at most the cap.
	MaxSpotPrice Price
}

// SpotPriceFits reports whether the request may run on node n at n's
// current spot price: always without a cap; with one, only when the price
// is known, in the cap's currency, and not above it.
func (r *Request) SpotPriceFits(n *Node) bool {
	if !r.MaxSpotPrice.Known() {
		return true
	}
	p := n.CurrentSpotPrice()
	return p.Currency == r.MaxSpotPrice.Currency && p.Micros <= r.MaxSpotPrice.Micros
}

// Placement is a decision: the node, the epoch it was made against, and the
// shares of its GPUs.
type Placement struct {
	NodeID    string
	Epoch     uint64
	CPUMilli  int64
	MemoryMiB int64
	GPUs      []Share
	// Model of the GPUs (all GPUs of a rental are of one model).
	Model string
	// Score is the winning node's score under the policy.
	Score int64
}

// Clone returns a deep copy of the node.
func (n *Node) Clone() Node {
	c := *n
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		if c.GPUs[i].MIGInstances != nil {
			c.GPUs[i].MIGInstances = slices.Clone(c.GPUs[i].MIGInstances)
		}
	}
	c.Allocations = slices.Clone(n.Allocations)
	return c
}

// Apply deducts a placement from the node (the optimistic, local view of a
// reservation), recording the allocation.
func (n *Node) Apply(r *Request, p Placement, now time.Time) {
	n.FreeCPUMilli -= p.CPUMilli
	n.FreeMemoryMiB -= p.MemoryMiB
	for _, s := range p.GPUs {
		g := &n.GPUs[s.Index]
		g.FreeMilli -= s.Milli
		g.FreeVRAMMiB -= s.VRAMMiB
		g.Sharers++
		if s.MIGProfile != "" {
			if prof, ok := ParseMIGProfile(s.MIGProfile); ok {
				g.MIGSlices += prof.Slices
			}
			g.holdMIG(s.MIGInstance, r.ID)
		}
	}
	n.Allocations = append(n.Allocations, Allocation{
		RentalID: r.ID, Tenant: r.Tenant, Class: r.Class, Priority: r.Priority,
		CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB, GPUs: slices.Clone(p.GPUs), Since: now, MaxSpotPrice: r.MaxSpotPrice,
	})
}

// Remove gives an allocation's capacity back to the node; false when the
// node does not hold it.
func (n *Node) Remove(rentalID string) bool {
	i := slices.IndexFunc(n.Allocations, func(a Allocation) bool { return a.RentalID == rentalID })
	if i < 0 {
		return false
	}
	a := n.Allocations[i]
	n.FreeCPUMilli += a.CPUMilli
	n.FreeMemoryMiB += a.MemoryMiB
	for _, s := range a.GPUs {
		g := &n.GPUs[s.Index]
		g.FreeMilli += s.Milli
		g.FreeVRAMMiB += s.VRAMMiB
		g.Sharers--
		if s.MIGProfile != "" {
			if prof, ok := ParseMIGProfile(s.MIGProfile); ok {
				g.MIGSlices -= prof.Slices
			}
			g.holdMIG(s.MIGInstance, "")
		}
	}
	n.Allocations = slices.Delete(n.Allocations, i, i+1)
	return true
}

// holdMIG records rental (empty: nobody) as the holder of instance uuid.
func (g *GPU) holdMIG(uuid, rental string) {
	for k := range g.MIGInstances {
		if g.MIGInstances[k].UUID == uuid {
			g.MIGInstances[k].Holder = rental
			return
		}
	}
}

// freeMilli is R_n: the node's idle milli-GPU.
func (n *Node) freeMilli() int64 {
	var r int64
	for i := range n.GPUs {
		r += n.GPUs[i].FreeMilli
	}
	return r
}

// model is the GPU model of the node (of its first GPU).
func (n *Node) model() string {
	if len(n.GPUs) == 0 {
		return ""
	}
	return n.GPUs[0].Model
}
