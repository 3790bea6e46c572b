package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	nodeagent "github.com/shizu-gpu/shizu/services/node-agent/app"
)

// devProvider is the autoscaler's fleet provider inside `shizu dev`: a
// provisioned node is one more in-process node agent of the simulated
// fleet (profile from the policy's instance type), a released one is
// stopped and forgotten. It implements provider.Provider; the autoscaler
// builds it through Deps.NewProvider.
type devProvider struct {
	runner *fleetRunner
	ctx    context.Context   // the agents' lifetime
	types  map[string]string // instance type -> simulated profile
	config func(fleetNode) nodeagent.Config
	now    func() time.Time

	mu    sync.Mutex
	nodes map[string]provider.Node
	seq   int
}

// fleetProvider is the autoscaler's Deps.NewProvider in `shizu dev`: a
// dev provider of the stack's fleet, selling the policy's instance types
// (type name -> simulated profile).
func (s *devStack) fleetProvider(profiles map[string]string) (provider.Provider, error) {
	return newDevProvider(s.ctx, s.fleet, profiles, s.agentConfig), nil
}

func newDevProvider(ctx context.Context, runner *fleetRunner, profiles map[string]string, config func(fleetNode) nodeagent.Config) *devProvider {
	return &devProvider{runner: runner, ctx: ctx, types: profiles, config: config, now: time.Now, nodes: map[string]provider.Node{}}
}

// Provision starts n node agents of the instance type's profile, all or
// nothing.
func (p *devProvider) Provision(_ context.Context, instanceType string, market provider.Market, zone string, n int) ([]string, error) {
	if err := provider.CheckCount(n); err != nil {
		return nil, err
	}
	profile, ok := p.types[instanceType]
	if !ok {
		return nil, fmt.Errorf("%w: %q", provider.ErrUnknownInstanceType, instanceType)
	}
	var ids []string
	for range n {
		p.mu.Lock()
		p.seq++
		node := fleetNode{ID: fmt.Sprintf("%s-auto-%d", profile, p.seq), Profile: profile, Market: string(market)}
		p.mu.Unlock()
		cfg := p.config(node)
		cfg.InstanceType = instanceType
		if zone != "" {
			cfg.Zone = zone
		}
		err := p.runner.add(node, cfg)
		if err == nil {
			err = p.runner.start(p.ctx, node.ID)
		}
		if err != nil {
			for _, id := range ids {
				_ = p.Release(p.ctx, id)
			}
			return nil, fmt.Errorf("provision %s: %w", node.ID, err)
		}
		p.mu.Lock()
		p.nodes[node.ID] = provider.Node{ID: node.ID, InstanceType: instanceType, Market: market, Zone: cfg.Zone, CreatedAt: p.now()}
		p.mu.Unlock()
		ids = append(ids, node.ID)
	}
	return ids, nil
}

// Release stops a provisioned node's agent and forgets it; unknown nodes
// (and the fleet given on the command line) are left alone.
func (p *devProvider) Release(_ context.Context, node string) error {
	p.mu.Lock()
	_, ok := p.nodes[node]
	delete(p.nodes, node)
	p.mu.Unlock()
	if ok {
		p.runner.remove(node)
	}
	return nil
}

// List returns the provisioned nodes, sorted by id.
func (p *devProvider) List(context.Context) ([]provider.Node, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]provider.Node, 0, len(p.nodes))
	for _, n := range p.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
