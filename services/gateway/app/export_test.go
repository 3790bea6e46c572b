package app

import "github.com/shizu-gpu/shizu/services/gateway/identity"

// RouteKeys lists "METHOD path" of every route the replica serves.
func (g *Gateway) RouteKeys() []string {
	out := make([]string, 0, len(g.routes))
	for k := range g.routes {
		out = append(out, k)
	}
	return out
}

// Identity is the replica's tenants and keys.
func (g *Gateway) Identity() *identity.Directory { return g.dir }

// OperatorOnly makes the route "METHOD path" an operator endpoint, for
// tests of the operator keys' access before there is one.
func (g *Gateway) OperatorOnly(methodPath string) {
	rt := g.routes[methodPath]
	rt.access = operatorOnly
	g.routes[methodPath] = rt
}
