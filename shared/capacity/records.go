package capacity

import (
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The JSON written to Redis. These records, not the exported types, define
// the stored format: the Lua scripts read the allocation fields by these
// names (rental_id, node_id, epoch, cpu_milli, memory_mib, gpus[].index,
// .milli, .vram_mib, .mig_profile).

type nodeRecord struct {
	ID                    string            `json:"id"`
	Zone                  string            `json:"zone"`
	Market                Market            `json:"market"`
	PricePerGPUHourMicros int64             `json:"price_per_gpu_hour_micros"`
	Currency              string            `json:"currency"`
	TEECapable            bool              `json:"tee_capable"`
	CPUMilli              int64             `json:"cpu_milli"`
	MemoryMiB             int64             `json:"memory_mib"`
	GPUs                  []gpuRecord       `json:"gpus"`
	NVLinkDomains         [][]int           `json:"nvlink_domains,omitempty"`
	Labels                map[string]string `json:"labels,omitempty"`
}

type gpuRecord struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	VRAMMiB     int64  `json:"vram_mib"`
	MIGCapable  bool   `json:"mig_capable"`
	NVLinkPeers []int  `json:"nvlink_peers,omitempty"`
	MaxSharers  int    `json:"max_sharers"`
	MIGEnabled  bool   `json:"mig_enabled,omitempty"`
	// MIGInstances: the Lua scripts do not read them; Register passes
	// their UUIDs as arguments.
	MIGInstances []migRecord `json:"mig_instances,omitempty"`
}

type migRecord struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
	VRAMMiB int64  `json:"vram_mib"`
}

type allocationRecord struct {
	RentalID  string        `json:"rental_id"`
	NodeID    string        `json:"node_id"`
	Epoch     uint64        `json:"epoch"`
	Tenant    string        `json:"tenant"`
	CPUMilli  int64         `json:"cpu_milli"`
	MemoryMiB int64         `json:"memory_mib"`
	GPUs      []shareRecord `json:"gpus"`
	CreatedAt time.Time     `json:"created_at"`
	// HandOver marks the node's copy of an allocation handed over by
	// Store.HandOver (see handover.go); the index never holds such a copy.
	HandOver bool `json:"handover,omitempty"`
	// Attempt is Placement.Attempt (absent when 0); the restore script
	// reads it.
	Attempt int32 `json:"attempt,omitempty"`
	// GPUModels is the model of each of GPUs, as its tenant's usage
	// counted it (quota.go): written by the reserve script (in front of
	// the rest) and by Restore; absent when the node's GPUs had none.
	GPUModels []string `json:"gpu_models,omitempty"`
}

type shareRecord struct {
	Index       int    `json:"index"`
	Milli       int64  `json:"milli"`
	VRAMMiB     int64  `json:"vram_mib"`
	MIGProfile  string `json:"mig_profile,omitempty"`
	MIGInstance string `json:"mig_instance,omitempty"`
}

func encodeNode(n Node) ([]byte, error) {
	r := nodeRecord{
		ID: n.ID, Zone: n.Zone, Market: n.Market,
		PricePerGPUHourMicros: n.PricePerGPUHourMicros, Currency: n.Currency,
		TEECapable: n.TEECapable, CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB,
		NVLinkDomains: n.NVLinkDomains, Labels: n.Labels,
		GPUs: make([]gpuRecord, len(n.GPUs)),
	}
	for i, g := range n.GPUs {
		r.GPUs[i] = gpuRecord{
			Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMMiB: g.VRAMMiB,
			MIGCapable: g.MIGCapable, NVLinkPeers: g.NVLinkPeers, MaxSharers: g.MaxSharers,
			MIGEnabled: g.MIGEnabled,
		}
		for _, m := range g.MIGInstances {
			r.GPUs[i].MIGInstances = append(r.GPUs[i].MIGInstances, migRecord(m))
		}
	}
	return json.Marshal(r)
}

func decodeNode(raw string) (Node, error) {
	var r nodeRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return Node{}, err
	}
	n := Node{
		ID: r.ID, Zone: r.Zone, Market: r.Market,
		PricePerGPUHourMicros: r.PricePerGPUHourMicros, Currency: r.Currency,
		TEECapable: r.TEECapable, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB,
		NVLinkDomains: r.NVLinkDomains, Labels: r.Labels,
		GPUs: make([]GPU, len(r.GPUs)),
	}
	for i, g := range r.GPUs {
		n.GPUs[i] = GPU{
			Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMMiB: g.VRAMMiB,
			MIGCapable: g.MIGCapable, NVLinkPeers: g.NVLinkPeers, MaxSharers: g.MaxSharers,
			MIGEnabled: g.MIGEnabled,
		}
		for _, m := range g.MIGInstances {
			n.GPUs[i].MIGInstances = append(n.GPUs[i].MIGInstances, MIGInstance(m))
		}
	}
	return n, nil
}

// cloneNode copies n's slices and map, so a caller may change its copy.
func cloneNode(n Node) Node {
	n.GPUs = slices.Clone(n.GPUs)
	for i := range n.GPUs {
		n.GPUs[i].NVLinkPeers = slices.Clone(n.GPUs[i].NVLinkPeers)
		n.GPUs[i].MIGInstances = slices.Clone(n.GPUs[i].MIGInstances)
	}
	if n.NVLinkDomains != nil {
		n.NVLinkDomains = slices.Clone(n.NVLinkDomains)
		for i := range n.NVLinkDomains {
			n.NVLinkDomains[i] = slices.Clone(n.NVLinkDomains[i])
		}
	}
	n.Labels = maps.Clone(n.Labels)
	return n
}

// encodeAllocation is p's record; models, when given, are its shares'
// GPU models (Restore: Reserve's script adds them itself).
func encodeAllocation(p Placement, created time.Time, models ...string) ([]byte, error) {
	r := allocationRecord{
		RentalID: p.RentalID, NodeID: p.NodeID, Epoch: p.Epoch, Tenant: p.Tenant,
		CPUMilli: p.CPUMilli, MemoryMiB: p.MemoryMiB, CreatedAt: created, Attempt: p.Attempt,
		GPUs: make([]shareRecord, len(p.GPUs)), GPUModels: models,
	}
	for i, g := range p.GPUs {
		r.GPUs[i] = shareRecord(g)
	}
	return json.Marshal(r)
}

func decodeAllocation(raw string) (Allocation, error) {
	var r allocationRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return Allocation{}, fmt.Errorf("decode allocation: %w", err)
	}
	a := Allocation{
		Placement: Placement{
			RentalID: r.RentalID, NodeID: r.NodeID, Epoch: r.Epoch, Tenant: r.Tenant,
			CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Attempt: r.Attempt,
			GPUs: make([]GPUShare, len(r.GPUs)),
		},
		CreatedAt:   r.CreatedAt,
		HandingOver: r.HandOver,
	}
	for i, g := range r.GPUs {
		a.GPUs[i] = GPUShare(g)
	}
	return a, nil
}

// decodeAllocations decodes a list of allocation JSONs, sorted by rental id.
func decodeAllocations(raws []any) ([]Allocation, error) {
	return (*decodeCache)(nil).allocations(raws)
}

// decodeCache remembers what one Snapshot decoded so that the next one
// decodes only what changed: a node's static facts change rarely and an
// allocation's JSON never. Entries are keyed by the raw JSON itself, and a
// Snapshot keeps only the entries it used, so the cache holds at most one
// snapshot's worth. Callers get copies, never the cached values. A nil
// *decodeCache decodes everything.
type decodeCache struct {
	nodes  map[string]Node
	allocs map[string]Allocation
	prev   *decodeCache
}

// next returns an empty cache that reuses the entries of c.
func (c *decodeCache) next() *decodeCache {
	return &decodeCache{nodes: map[string]Node{}, allocs: map[string]Allocation{}, prev: c}
}

func (c *decodeCache) node(raw string) (Node, error) {
	if c == nil {
		return decodeNode(raw)
	}
	n, ok := c.nodes[raw]
	if !ok && c.prev != nil {
		n, ok = c.prev.nodes[raw]
	}
	if !ok {
		var err error
		if n, err = decodeNode(raw); err != nil {
			return Node{}, err
		}
	}
	c.nodes[raw] = n
	return cloneNode(n), nil
}

func (c *decodeCache) allocation(raw string) (Allocation, error) {
	if c == nil {
		return decodeAllocation(raw)
	}
	a, ok := c.allocs[raw]
	if !ok && c.prev != nil {
		a, ok = c.prev.allocs[raw]
	}
	if !ok {
		var err error
		if a, err = decodeAllocation(raw); err != nil {
			return Allocation{}, err
		}
	}
	c.allocs[raw] = a
	a.GPUs = slices.Clone(a.GPUs)
	return a, nil
}

func (c *decodeCache) allocations(raws []any) ([]Allocation, error) {
	out := make([]Allocation, 0, len(raws))
	for _, raw := range raws {
		a, err := c.allocation(str(raw))
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Allocation) int { return strings.Compare(a.RentalID, b.RentalID) })
	return out, nil
}

// decodeNodeState builds a NodeState from a node hash's HGETALL reply and
// its allocations; ok is false when the hash was empty (no such node).
func decodeNodeState(c *decodeCache, id string, fields any, allocs []any) (NodeState, bool, error) {
	var st NodeState
	count := -1
	fail := func(field string, err error) (NodeState, bool, error) {
		return NodeState{}, false, fmt.Errorf("node %s: field %s: %w", id, field, err)
	}
	empty := true
	for k, v := range hashPairs(fields) {
		empty = false
		var err error
		switch k {
		case "spec":
			st.Node, err = c.node(v)
		case "status":
			st.Status = NodeStatus(v)
		case "epoch":
			st.Epoch, err = strconv.ParseUint(v, 10, 64)
		case "cpu_free":
			st.FreeCPUMilli, err = strconv.ParseInt(v, 10, 64)
		case "mem_free":
			st.FreeMemoryMiB, err = strconv.ParseInt(v, 10, 64)
		case "gpus":
			count, err = strconv.Atoi(v)
		default:
			err = setGPUField(&st.FreeGPUs, k, v)
		}
		if err != nil {
			return fail(k, err)
		}
	}
	if empty {
		return NodeState{}, false, nil
	}
	if count != len(st.FreeGPUs) || count != len(st.GPUs) {
		return fail("gpus", fmt.Errorf("count %d, %d GPU states, %d GPUs in spec", count, len(st.FreeGPUs), len(st.GPUs)))
	}
	for i := range st.FreeGPUs {
		slices.Sort(st.FreeGPUs[i].FreeMIGInstances)
	}
	var err error
	if st.Allocations, err = c.allocations(allocs); err != nil {
		return fail("allocs", err)
	}
	return st, true, nil
}

// hashPairs yields the fields and values of an HGETALL reply, which is a
// flat list under RESP2 and a map under RESP3 (go-redis's default).
func hashPairs(reply any) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		switch r := reply.(type) {
		case []any:
			for i := 0; i+1 < len(r); i += 2 {
				if !yield(str(r[i]), str(r[i+1])) {
					return
				}
			}
		case map[any]any:
			for k, v := range r {
				if !yield(str(k), str(v)) {
					return
				}
			}
		}
	}
}

// setGPUField parses a per-GPU field "g<i>.<name>" into gpus[i].
func setGPUField(gpus *[]FreeGPU, k, v string) error {
	dot := strings.IndexByte(k, '.')
	if len(k) < 2 || k[0] != 'g' || dot < 0 {
		return nil // a field this version does not know: ignore it
	}
	i, err := strconv.Atoi(k[1:dot])
	if err != nil || i < 0 || i >= MaxGPUsPerNode {
		return fmt.Errorf("bad GPU index in %q", k)
	}
	for len(*gpus) <= i {
		*gpus = append(*gpus, FreeGPU{Index: len(*gpus)})
	}
	g := &(*gpus)[i]
	if strings.HasPrefix(k[dot+1:], "mip.") {
		return nil // a MIG instance's profile: in the spec
	}
	if uuid, ok := strings.CutPrefix(k[dot+1:], "mi."); ok {
		if v == "" {
			g.FreeMIGInstances = append(g.FreeMIGInstances, uuid)
		}
		return nil
	}
	switch k[dot+1:] {
	case "mig", "migmode":
		return nil // MIG capability and mode are in the spec
	case "health":
		g.Health = GPUHealth(v)
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return err
	}
	switch k[dot+1:] {
	case "milli":
		g.Milli = n
	case "vram":
		g.VRAMMiB = n
	case "sharers":
		g.Sharers = int(n)
	case "max":
		g.MaxSharers = int(n)
	}
	return nil
}

// str and num read the loosely typed values of a script reply.
func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case []byte:
		return string(x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
