package placement_test

import (
	"fmt"
	"testing"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// a100 is node(id, n) with A100 80 GB GPUs instead of H100s.
func a100(id string, n int) placement.Node {
	return with(node(id, n), func(nd *placement.Node) {
		for i := range nd.GPUs {
			nd.GPUs[i].Model = "A100-SXM4-80GB"
		}
	})
}

// cluster is four H100 nodes with the A100 node at position at (when
// withA100).
func preferCluster(at int, withA100 bool) *placement.Cluster {
	var nodes []placement.Node
	for i := range 4 {
		nodes = append(nodes, node(fmt.Sprintf("h%d", i), 8))
	}
	if withA100 {
		nodes = append(nodes[:at], append([]placement.Node{a100("a", 8)}, nodes[at:]...)...)
	}
	return &placement.Cluster{Nodes: nodes}
}

func preferred(models ...string) func(*placement.Request) {
	return func(r *placement.Request) { r.PreferredModels = models }
}

// Under every policy, a node of a preferred model that passes every filter
// wins over any other, wherever it stands in the cluster and whatever the
// policy's score says.
func TestAPreferredModelWinsUnderEveryPolicy(t *testing.T) {
	t.Parallel()
	for _, pol := range placement.Policies {
		for at := range 5 {
			for _, shape := range []func(*placement.Request){gpus(1), gpus(2), fraction(500, 8192)} {
				r := req(fmt.Sprintf("r-%d", at), shape, preferred("A100-SXM4-80GB"))
				p, err := placer(t, pol).Place(preferCluster(at, true), &r)
				if err != nil {
					t.Fatalf("%s at %d: %v", pol, at, err)
				}
				if p.NodeID != "a" || p.Model != "A100-SXM4-80GB" {
					t.Fatalf("%s, A100 node at %d, %+v: placed on %s (%s), want the free A100 node", pol, at, r, p.NodeID, p.Model)
				}
			}
		}
	}
}

// A preference is not a filter: with no node of the preferred model free,
// the request takes another model.
func TestAPreferredModelThatIsNotFreeTakesAnother(t *testing.T) {
	t.Parallel()
	for _, pol := range placement.Policies {
		c := preferCluster(0, true)
		c.Nodes[0].Ready = false // the A100 node is not schedulable
		r := req("r", preferred("A100-SXM4-80GB"))
		p, err := placer(t, pol).Place(c, &r)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		if p.Model != "H100-SXM5-80GB" {
			t.Fatalf("%s: placed on %s (%s), want an H100", pol, p.NodeID, p.Model)
		}
		r = req("r2", preferred("RTX4090")) // no such node at all
		if _, err := placer(t, pol).Place(preferCluster(0, false), &r); err != nil {
			t.Fatalf("%s: a preference for a model no node has: %v", pol, err)
		}
	}
}

// No preference changes nothing: the same placement as before.
func TestNoPreferredModelChangesNothing(t *testing.T) {
	t.Parallel()
	for _, pol := range placement.Policies {
		for at := range 5 {
			plain, with := req("r"), req("r", preferred())
			a, err1 := placer(t, pol).Place(preferCluster(at, true), &plain)
			b, err2 := placer(t, pol).Place(preferCluster(at, true), &with)
			if err1 != nil || err2 != nil || a.NodeID != b.NodeID || a.Score != b.Score {
				t.Fatalf("%s at %d: %+v %v vs %+v %v", pol, at, a, err1, b, err2)
			}
		}
	}
}

// A scan stopped at MaxCandidates still finds a node of a preferred model.
func TestAPreferredModelIsFoundPastMaxCandidates(t *testing.T) {
	t.Parallel()
	for _, pol := range placement.Policies {
		pl, err := placement.NewPlacer(placement.Options{Policy: pol, MaxCandidates: 1})
		if err != nil {
			t.Fatal(err)
		}
		for at := range 5 {
			r := req(fmt.Sprintf("r-%d", at), preferred("A100-SXM4-80GB"))
			p, err := pl.Place(preferCluster(at, true), &r)
			if err != nil || p.NodeID != "a" {
				t.Fatalf("%s, A100 node at %d: placed on %s, %v; want the A100 node", pol, at, p.NodeID, err)
			}
		}
	}
}
