// Package fleet decides how the shared GPU fleet grows and shrinks: which
// nodes to provision for a capacity shortage, and which idle nodes to drain
// and then release. It is pure: decisions take the configuration, plain
// views of the nodes and `now`. A node that holds a rental is never
// drained for idleness nor released.
package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// Duration is a time.Duration written as a Go duration string ("90s", "5m").
type Duration time.Duration

// UnmarshalJSON reads "90s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"90s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. \"90s\", \"5m\")", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Market is how a node is bought: Shizu's one market vocabulary,
// shared/rent.
type Market = rent.Market

// Markets.
const (
	OnDemand = rent.OnDemand
	Spot     = rent.Spot
)

// Config is the fleet section of the policy file.
type Config struct {
	// InstanceTypes the provider can start; empty disables provisioning.
	InstanceTypes []InstanceType `json:"instance_types"`
	// DefaultMarket buys nodes for shortages that accept either market
	// ("on-demand", the default, or "spot"); when spot is short such a
	// shortage falls back to on-demand.
	DefaultMarket Market `json:"default_market,omitempty"`
	// DefaultZone is used when neither the shortage nor the type names one.
	DefaultZone string `json:"default_zone"`
	// MinNodes are never released for idleness; MaxNodes bounds the fleet.
	MinNodes int `json:"min_nodes"`
	MaxNodes int `json:"max_nodes"`
	// IdleAfter: a ready node without rentals for this long is drained.
	IdleAfter Duration `json:"idle_after"`
	// RegisterTimeout: a provisioned node that has not registered by then
	// is released as failed.
	RegisterTimeout Duration `json:"register_timeout"`
}

// InstanceType is one kind of node the provider sells.
type InstanceType struct {
	// Name is the provider's type, e.g. "p5.48xlarge".
	Name string `json:"name"`
	// Profile is the simulated GPU profile the local provider starts for it
	// (node-agent -simulate <profile>), e.g. "h100x8".
	Profile string `json:"profile"`
	// Model is the normalized GPU model token, e.g. "H100-SXM5-80GB".
	Model string `json:"model"`
	// GPUs per node.
	GPUs int `json:"gpus"`
	// Zones it exists in; empty means DefaultZone only.
	Zones []string `json:"zones,omitempty"`
	// PricePerGPUHourMicros orders candidates: the cheapest that fits wins.
	PricePerGPUHourMicros int64 `json:"price_per_gpu_hour_micros"`
}

// Validate reports every problem with its field path.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.DefaultMarket != "" && c.DefaultMarket != OnDemand && c.DefaultMarket != Spot {
		add("default_market", "%q is not %q or %q", c.DefaultMarket, OnDemand, Spot)
	}
	if c.MinNodes < 0 {
		add("min_nodes", "%d is negative", c.MinNodes)
	}
	if c.MaxNodes < c.MinNodes {
		add("max_nodes", "%d is below min_nodes %d", c.MaxNodes, c.MinNodes)
	}
	if len(c.InstanceTypes) > 0 {
		if c.MaxNodes < 1 {
			add("max_nodes", "%d; must be at least 1 when instance_types are declared", c.MaxNodes)
		}
		if c.IdleAfter <= 0 {
			add("idle_after", "%s; must be positive", c.IdleAfter.D())
		}
		if c.RegisterTimeout <= 0 {
			add("register_timeout", "%s; must be positive", c.RegisterTimeout.D())
		}
	}
	names := map[string]bool{}
	for i, t := range c.InstanceTypes {
		p := fmt.Sprintf("instance_types[%d]", i)
		if !token(t.Name) {
			add(p+".name", "%q: required, printable ASCII without spaces", t.Name)
		}
		if names[t.Name] {
			add(p+".name", "%q is declared twice", t.Name)
		}
		names[t.Name] = true
		if !token(t.Profile) {
			add(p+".profile", "%q: required, without spaces", t.Profile)
		}
		if !token(t.Model) {
			add(p+".model", "%q: required, without spaces", t.Model)
		}
		if t.GPUs < 1 || t.GPUs > 64 {
			add(p+".gpus", "%d is out of range 1..64", t.GPUs)
		}
		if t.PricePerGPUHourMicros < 0 {
			add(p+".price_per_gpu_hour_micros", "%d is negative", t.PricePerGPUHourMicros)
		}
		if len(t.Zones) == 0 && c.DefaultZone == "" {
			add(p+".zones", "empty and fleet.default_zone is not set: the type has no zone")
		}
	}
	return errors.Join(errs...)
}

func token(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// Shortage is a capacity shortage in plain values: the shape one waiting
// rental needs and the rentals waiting for it.
type Shortage struct {
	// EventID identifies the shortage report.
	EventID  string
	GPUCount int
	// Models acceptable; empty means any.
	Models []string
	// Zone required; empty means any.
	Zone string
	// Market required; empty means either.
	Market  Market
	Rentals []string
}

// Provision is a request for Count nodes of one type.
type Provision struct {
	InstanceType InstanceType
	Market       Market
	Zone         string
	Count        int
	// Rentals are the waiting rentals these nodes are for.
	Rentals []string
	Reason  string
}

// ErrNoInstanceType: no declared type can hold the shortage's shape.
var ErrNoInstanceType = errors.New("no instance type fits")

// ErrFleetFull: the fleet is at max_nodes.
var ErrFleetFull = errors.New("fleet at max_nodes")

// PlanProvision picks the cheapest instance type that holds one waiting
// rental's shape, in a zone and market the shortage allows, and enough
// nodes for the rentals not already covered by provisioning in flight
// (covered), within max_nodes (fleetSize counts nodes existing or
// starting). A Provision with Count 0 means nothing needs doing.
func PlanProvision(c Config, s Shortage, fleetSize int, covered func(rental string) bool, defaultMarket Market) (Provision, error) {
	var waiting []string
	for _, r := range s.Rentals {
		if covered == nil || !covered(r) {
			waiting = append(waiting, r)
		}
	}
	if len(waiting) == 0 {
		return Provision{Reason: fmt.Sprintf("every waiting rental (%d) is covered by nodes already starting", len(s.Rentals))}, nil
	}
	need := max(s.GPUCount, 1)
	var cands []InstanceType
	for _, t := range c.InstanceTypes {
		if t.GPUs < need || (len(s.Models) > 0 && !slices.Contains(s.Models, t.Model)) {
			continue
		}
		if s.Zone != "" && !slices.Contains(zonesOf(c, t), s.Zone) {
			continue
		}
		cands = append(cands, t)
	}
	if len(cands) == 0 {
		return Provision{}, fmt.Errorf("%w: %d GPU(s) of %v in zone %q", ErrNoInstanceType, need, s.Models, s.Zone)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].PricePerGPUHourMicros != cands[j].PricePerGPUHourMicros {
			return cands[i].PricePerGPUHourMicros < cands[j].PricePerGPUHourMicros
		}
		return cands[i].Name < cands[j].Name
	})
	t := cands[0]
	perNode := t.GPUs / need
	count := int(math.Ceil(float64(len(waiting)) / float64(perNode)))
	room := c.MaxNodes - fleetSize
	if room <= 0 {
		return Provision{}, fmt.Errorf("%w: %d nodes, max %d", ErrFleetFull, fleetSize, c.MaxNodes)
	}
	capped := ""
	if count > room {
		count, capped = room, fmt.Sprintf(" (capped by max_nodes %d)", c.MaxNodes)
		waiting = waiting[:min(len(waiting), count*perNode)]
	}
	zone := s.Zone
	if zone == "" {
		zone = zonesOf(c, t)[0]
	}
	market := s.Market
	if market == "" {
		market = defaultMarket
	}
	if market == "" {
		market = OnDemand
	}
	return Provision{InstanceType: t, Market: market, Zone: zone, Count: count, Rentals: waiting,
		Reason: fmt.Sprintf("capacity shortage: %d rental(s) need %d GPU(s) each; %d per %s node -> %d node(s) on %s in %s%s",
			len(waiting), need, perNode, t.Name, count, market, zone, capped)}, nil
}

func zonesOf(c Config, t InstanceType) []string {
	if len(t.Zones) > 0 {
		return t.Zones
	}
	return []string{c.DefaultZone}
}

// NodeStatus is a node's status as the capacity store reports it, plus
// Unregistered for a node the provider started that has not registered.
type NodeStatus string

// Statuses.
const (
	Ready        NodeStatus = "ready"
	Draining     NodeStatus = "draining"
	Dead         NodeStatus = "dead"
	Unregistered NodeStatus = "unregistered"
)

// NodeView is what the fleet knows of one node the provider runs.
type NodeView struct {
	ID     string
	Status NodeStatus
	Epoch  uint64
	// Allocations is how many rentals hold capacity on it.
	Allocations int
	// Busy: telemetry saw GPU utilization recently.
	Busy bool
	// IdleSince is when it was first seen without rentals (zero if it has
	// some).
	IdleSince time.Time
	// CreatedAt is when the provider started it.
	CreatedAt time.Time
}

// ActionKind is what to do with a node.
type ActionKind string

// Actions.
const (
	// Drain: stop placing work there (DrainNode; status draining).
	Drain ActionKind = "drain"
	// Release: give the node back to the provider.
	Release ActionKind = "release"
)

// Action is one step of scale-in.
type Action struct {
	Node   string
	Kind   ActionKind
	Epoch  uint64
	Reason string
}

// PlanRelease decides the scale-in steps at now: a ready node idle for
// idle_after is drained (while more than min_nodes ready nodes remain); a
// draining or dead node that holds nothing is released; a node that never
// registered within register_timeout is released. A node that holds a
// rental or is busy is never touched.
func PlanRelease(c Config, nodes []NodeView, now time.Time) []Action {
	var out []Action
	ready := 0
	for _, n := range nodes {
		if n.Status == Ready {
			ready++
		}
	}
	sorted := slices.Clone(nodes)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, n := range sorted {
		inUse := n.Allocations > 0 || n.Busy
		switch {
		case n.Status == Unregistered:
			if now.Sub(n.CreatedAt) >= c.RegisterTimeout.D() {
				out = append(out, Action{Node: n.ID, Kind: Release,
					Reason: fmt.Sprintf("started %s ago and never registered (register_timeout %s)", now.Sub(n.CreatedAt).Round(time.Second), c.RegisterTimeout.D())})
			}
		case inUse:
			continue
		case n.Status == Draining || n.Status == Dead:
			out = append(out, Action{Node: n.ID, Kind: Release, Epoch: n.Epoch,
				Reason: fmt.Sprintf("%s and holds no rental", n.Status)})
		case n.Status == Ready && !n.IdleSince.IsZero() && now.Sub(n.IdleSince) >= c.IdleAfter.D() && ready > c.MinNodes:
			ready--
			out = append(out, Action{Node: n.ID, Kind: Drain, Epoch: n.Epoch,
				Reason: fmt.Sprintf("scale-in: no rental for %s (idle_after %s)", now.Sub(n.IdleSince).Round(time.Second), c.IdleAfter.D())})
		}
	}
	return out
}

// TrackIdle returns when each node was first seen without rentals, given
// the previous record: a node with rentals (or busy) is dropped, a newly
// idle one starts at now.
func TrackIdle(prev map[string]time.Time, nodes []NodeView, now time.Time) map[string]time.Time {
	next := make(map[string]time.Time, len(nodes))
	for _, n := range nodes {
		if n.Allocations > 0 || n.Busy {
			continue
		}
		if t, ok := prev[n.ID]; ok {
			next[n.ID] = t
		} else {
			next[n.ID] = now
		}
	}
	return next
}

// FreeGPU is what one GPU of a ready node has free.
type FreeGPU struct {
	Model   string
	Milli   int64
	VRAMMiB int64
	// Slots is how many more allocations the GPU may take (sharers).
	Slots int
}

// FreeNode is a node's free capacity, as the capacity store reports it.
type FreeNode struct {
	ID    string
	Ready bool
	Zone  string
	GPUs  []FreeGPU
}

// Shape is what one replica needs.
type Shape struct {
	GPUCount int
	MilliGPU int64
	VRAMMiB  int64
	Models   []string
	Zone     string
}

// FreeSlots counts how many replicas of shape the free capacity holds, each
// replica on one node: a whole-GPU replica takes GPUCount GPUs with
// everything free; a fraction takes MilliGPU (and VRAMMiB) of one GPU with
// a sharer slot left. It ignores NVLink and MIG: it is an estimate for
// provisioning ahead, and the scheduler's shortage reports correct it.
func FreeSlots(nodes []FreeNode, s Shape) int {
	total := 0
	for _, n := range nodes {
		if !n.Ready || (s.Zone != "" && n.Zone != s.Zone) {
			continue
		}
		if s.MilliGPU >= 1000 {
			whole := 0
			for _, g := range n.GPUs {
				if g.Milli >= 1000 && g.Slots > 0 && (len(s.Models) == 0 || slices.Contains(s.Models, g.Model)) {
					whole++
				}
			}
			total += whole / max(s.GPUCount, 1)
			continue
		}
		for _, g := range n.GPUs {
			if len(s.Models) > 0 && !slices.Contains(s.Models, g.Model) {
				continue
			}
			k := int(g.Milli / max(s.MilliGPU, 1))
			if s.VRAMMiB > 0 {
				k = min(k, int(g.VRAMMiB/s.VRAMMiB))
			}
			total += min(k, g.Slots)
		}
	}
	return total
}
