// Package view is the scheduling loop's in-memory picture of the capacity
// store: the cluster as placement sees it, an index by node id, the store
// version it was read at, the nodes to re-read, the facts events tell about
// nodes, the fragmentation meter against the recent workload, and the fixes
// found off the loop. It is pure (no I/O): the loop reads the store and
// hands the nodes in.
//
// A View belongs to one goroutine (the loop), except [View.Post], which any
// goroutine may call.
package view

import (
	"sync"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// Facts is what a RentalScheduled event tells about the node it names: its
// zone and its GPUs' UUIDs and models. A value is never changed once built,
// so the goroutine that publishes a round may read it while the loop moves
// on.
type Facts struct {
	Zone string
	GPUs []GPUFacts
}

// GPUFacts are one GPU's UUID and model.
type GPUFacts struct{ UUID, Model string }

// FactsOf is the facts of a node.
func FactsOf(n *placement.Node) *Facts {
	f := &Facts{Zone: n.Zone, GPUs: make([]GPUFacts, len(n.GPUs))}
	for i := range n.GPUs {
		f.GPUs[i] = GPUFacts{UUID: n.GPUs[i].UUID, Model: n.GPUs[i].Model}
	}
	return f
}

// Fix is a change to the view found after a round left it: the rental
// placed on Node in the view is not there in the store, and Stale (when
// set) names a node whose view is to be re-read.
type Fix struct {
	Node, Rental, Stale string
}

// View is the loop's state. The zero value is not usable; call New.
type View struct {
	cluster     placement.Cluster
	index       map[string]int
	version     uint64
	refreshedAt time.Time
	stale       map[string]bool
	// facts caches each node's Facts, dropped when the node is re-read.
	facts map[string]*Facts

	// window is the recent workload; meter keeps the view's fragmentation
	// measure node by node against the window's workload of generation
	// meterGen.
	window   *placement.Window
	meter    placement.FragMeter
	meterGen uint64

	fixMu sync.Mutex
	fixes []Fix
}

// New is an empty view that measures fragmentation against the last
// window requests.
func New(window int) *View {
	return &View{
		index: map[string]int{}, stale: map[string]bool{}, facts: map[string]*Facts{},
		window: placement.NewWindow(window, max(1, window/10)),
	}
}

// Cluster is the view as placement reads it. Callers may read it; they
// change it only through the View's methods.
func (v *View) Cluster() *placement.Cluster { return &v.cluster }

// Node is a node of the view.
func (v *View) Node(id string) (*placement.Node, bool) {
	k, ok := v.index[id]
	if !ok {
		return nil, false
	}
	return &v.cluster.Nodes[k], true
}

// Version is the store version the view was last read at in full.
func (v *View) Version() uint64 { return v.version }

// RefreshedAt is when the view was last read in full (zero: never).
func (v *View) RefreshedAt() time.Time { return v.refreshedAt }

// Reset replaces the whole view with nodes, read at store version version
// at at. The stale set and the facts are dropped, and the meter re-measured.
func (v *View) Reset(nodes []placement.Node, version uint64, at time.Time) {
	v.cluster.Nodes = v.cluster.Nodes[:0]
	clear(v.index)
	for i := range nodes {
		v.index[nodes[i].ID] = len(v.cluster.Nodes)
		v.cluster.Nodes = append(v.cluster.Nodes, nodes[i])
	}
	v.version, v.refreshedAt = version, at
	clear(v.stale)
	clear(v.facts)
	v.meter.Reset(&v.cluster, v.window.Workload())
	v.meterGen = v.window.Generation()
}

// SetNode replaces one node (or adds it) as re-read from the store.
func (v *View) SetNode(n placement.Node) {
	delete(v.facts, n.ID)
	i, known := v.index[n.ID]
	if known {
		v.cluster.Nodes[i] = n
	} else {
		i = len(v.cluster.Nodes)
		v.index[n.ID] = i
		v.cluster.Nodes = append(v.cluster.Nodes, n)
	}
	v.meter.Update(&v.cluster, i)
}

// NodeGone marks a node the store no longer holds as not ready.
func (v *View) NodeGone(id string) {
	if i, ok := v.index[id]; ok {
		v.cluster.Nodes[i].Ready = false
	}
}

// Apply books a placement of r into the view.
func (v *View) Apply(r *placement.Request, p placement.Placement, at time.Time) {
	k := v.index[p.NodeID]
	v.cluster.Nodes[k].Apply(r, p, at)
	v.meter.Update(&v.cluster, k)
}

// Remove takes a rental out of the view.
func (v *View) Remove(node, rental string) {
	if k, ok := v.index[node]; ok {
		v.cluster.Nodes[k].Remove(rental)
		v.meter.Update(&v.cluster, k)
	}
}

// MarkStale names a node to re-read before the next placement.
func (v *View) MarkStale(node string) { v.stale[node] = true }

// TakeStale returns the nodes to re-read and forgets them.
func (v *View) TakeStale() []string {
	if len(v.stale) == 0 {
		return nil
	}
	ids := make([]string, 0, len(v.stale))
	for id := range v.stale {
		ids = append(ids, id)
	}
	clear(v.stale)
	return ids
}

// Facts is the Facts of a node in the view (nil when it is not in it).
func (v *View) Facts(id string) *Facts {
	if f, ok := v.facts[id]; ok {
		return f
	}
	k, ok := v.index[id]
	if !ok {
		return nil
	}
	f := FactsOf(&v.cluster.Nodes[k])
	v.facts[id] = f
	return f
}

// Post queues fixes for the view; any goroutine may post.
func (v *View) Post(fixes ...Fix) {
	if len(fixes) == 0 {
		return
	}
	v.fixMu.Lock()
	v.fixes = append(v.fixes, fixes...)
	v.fixMu.Unlock()
}

// ApplyFixes takes the posted fixes into the view.
func (v *View) ApplyFixes() {
	v.fixMu.Lock()
	fixes := v.fixes
	v.fixes = nil
	v.fixMu.Unlock()
	for _, f := range fixes {
		v.Remove(f.Node, f.Rental)
		if f.Stale != "" {
			v.stale[f.Stale] = true
		}
	}
}

// Observe adds a newly requested shape to the recent workload.
func (v *View) Observe(r *placement.Request) { v.window.Add(placement.ShapeOf(r)) }

// Workload is the recent workload; when it moved on since the meter last
// measured, the meter is re-measured against it.
func (v *View) Workload() placement.Workload {
	w := v.window.Workload()
	if g := v.window.Generation(); g != v.meterGen {
		v.meter.Reset(&v.cluster, w)
		v.meterGen = g
	}
	return w
}

// Fragmentation is the view's fragmentation measure.
func (v *View) Fragmentation() placement.FragStats { return v.meter.Stats() }
