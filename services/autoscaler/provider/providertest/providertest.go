// Package providertest is the contract every provider.Provider keeps: the
// local, memory and `shizu dev` providers run it from their tests.
package providertest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Subject is the provider under test and what it sells.
type Subject struct {
	// New returns a fresh provider with no nodes; it is called once per
	// subtest. Anything it starts is cleaned up with t.Cleanup.
	New func(t *testing.T) provider.Provider
	// InstanceType is a type the provider sells, on-demand and spot.
	InstanceType string
	// UnknownInstanceType is a type it does not sell; empty when it sells
	// every type (the memory provider).
	UnknownInstanceType string
}

// Run runs the contract against s.
func Run(t *testing.T, s Subject) {
	t.Run("provisions n nodes with distinct subject-token ids, listed as asked", func(t *testing.T) {
		p := s.New(t)
		ids, err := p.Provision(t.Context(), s.InstanceType, provider.OnDemand, "z1", 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 2 || ids[0] == ids[1] {
			t.Fatalf("ids %v; want two distinct", ids)
		}
		for _, id := range ids {
			if id == "" || strings.ContainsAny(id, ".*> ") {
				t.Fatalf("node id %q is not a subject token", id)
			}
		}
		spot, err := p.Provision(t.Context(), s.InstanceType, provider.Spot, "z1", 1)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := p.List(t.Context())
		if err != nil || len(nodes) != 3 {
			t.Fatalf("list %+v, %v; want 3 nodes", nodes, err)
		}
		if !slices.IsSortedFunc(nodes, func(a, b provider.Node) int { return strings.Compare(a.ID, b.ID) }) {
			t.Errorf("list not sorted by id: %+v", nodes)
		}
		for _, n := range nodes {
			if n.InstanceType != s.InstanceType || n.Zone != "z1" || n.CreatedAt.IsZero() {
				t.Errorf("node %+v; want type %s in z1 with a creation time", n, s.InstanceType)
			}
			want := provider.OnDemand
			if n.ID == spot[0] {
				want = provider.Spot
			}
			if n.Market != want {
				t.Errorf("node %s listed on %s, provisioned on %s", n.ID, n.Market, want)
			}
		}
	})
	t.Run("provisioning fewer than one node is invalid input, never nothing and no error", func(t *testing.T) {
		p := s.New(t)
		for _, n := range []int{0, -1} {
			ids, err := p.Provision(t.Context(), s.InstanceType, provider.OnDemand, "z1", n)
			if !fault.IsInvalid(err) || ids != nil {
				t.Errorf("Provision(n=%d) = %v, %v; want no ids and an invalid-input error", n, ids, err)
			}
		}
		if nodes, err := p.List(t.Context()); err != nil || len(nodes) != 0 {
			t.Errorf("after refused provisions: %+v, %v", nodes, err)
		}
	})
	if s.UnknownInstanceType != "" {
		t.Run("an instance type it does not sell is ErrUnknownInstanceType", func(t *testing.T) {
			p := s.New(t)
			ids, err := p.Provision(t.Context(), s.UnknownInstanceType, provider.OnDemand, "z1", 1)
			if !errors.Is(err, provider.ErrUnknownInstanceType) || ids != nil {
				t.Errorf("Provision(%q) = %v, %v; want ErrUnknownInstanceType", s.UnknownInstanceType, ids, err)
			}
		})
	}
	t.Run("release is idempotent and unknown nodes are not an error", func(t *testing.T) {
		p := s.New(t)
		ids, err := p.Provision(t.Context(), s.InstanceType, provider.OnDemand, "z1", 2)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := p.Release(t.Context(), ids[0]); err != nil {
				t.Fatalf("release %s: %v", ids[0], err)
			}
		}
		if err := p.Release(t.Context(), "never-provisioned"); err != nil {
			t.Fatalf("release of an unknown node: %v", err)
		}
		nodes, err := p.List(t.Context())
		if err != nil || len(nodes) != 1 || nodes[0].ID != ids[1] {
			t.Fatalf("after release: %+v, %v; want only %s", nodes, err, ids[1])
		}
	})
}
