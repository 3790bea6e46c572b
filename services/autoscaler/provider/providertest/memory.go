package providertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
)

// Call is one call a Memory provider received.
type Call struct {
	Op           string // "provision" or "release"
	InstanceType string
	Market       provider.Market
	Zone         string
	N            int
	Node         string
	IDs          []string
}

// Memory is an in-process provider whose nodes are only records: it
// records every call and can be told to fail. Tests use it where no agent
// process is wanted; it keeps the contract (Run) like the real ones.
type Memory struct {
	mu    sync.Mutex
	seq   int
	nodes map[string]provider.Node
	calls []Call
	// SpotCapacity bounds spot nodes at once; negative is unlimited.
	SpotCapacity int
	// Fail, when set, is returned by the next calls to Provision.
	Fail error
	Now  func() time.Time
}

// NewMemory returns an empty in-memory provider with unlimited spot.
func NewMemory() *Memory {
	return &Memory{nodes: map[string]provider.Node{}, SpotCapacity: -1, Now: time.Now}
}

// Provision records n nodes.
func (m *Memory) Provision(ctx context.Context, instanceType string, market provider.Market, zone string, n int) ([]string, error) {
	if err := provider.CheckCount(n); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.Fail != nil {
		err := m.Fail
		m.calls = append(m.calls, Call{Op: "provision", InstanceType: instanceType, Market: market, Zone: zone, N: n})
		m.mu.Unlock()
		return nil, err
	}
	if market == provider.Spot && m.SpotCapacity >= 0 {
		spot := 0
		for _, nd := range m.nodes {
			if nd.Market == provider.Spot {
				spot++
			}
		}
		if spot+n > m.SpotCapacity {
			m.calls = append(m.calls, Call{Op: "provision", InstanceType: instanceType, Market: market, Zone: zone, N: n})
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %d spot nodes asked, %d of %d in use", provider.ErrInsufficientCapacity, n, spot, m.SpotCapacity)
		}
	}
	var created []provider.Node
	for range n {
		m.seq++
		id := fmt.Sprintf("mem-%s-%d", token(instanceType), m.seq)
		nd := provider.Node{ID: id, InstanceType: instanceType, Market: market, Zone: zone, CreatedAt: m.Now()}
		m.nodes[id] = nd
		created = append(created, nd)
	}
	ids := make([]string, len(created))
	for i, nd := range created {
		ids[i] = nd.ID
	}
	m.calls = append(m.calls, Call{Op: "provision", InstanceType: instanceType, Market: market, Zone: zone, N: n, IDs: ids})
	m.mu.Unlock()
	return ids, nil
}

// Release forgets a node.
func (m *Memory) Release(_ context.Context, node string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.nodes, node)
	m.calls = append(m.calls, Call{Op: "release", Node: node})
	return nil
}

// List returns the recorded nodes.
func (m *Memory) List(context.Context) ([]provider.Node, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]provider.Node, 0, len(m.nodes))
	for _, nd := range m.nodes {
		out = append(out, nd)
	}
	slices.SortFunc(out, func(a, b provider.Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Calls returns a copy of the calls so far.
func (m *Memory) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// token makes an instance type a subject token (letters, digits, '-'), as
// node ids must be.
func token(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
}
