package failovertest

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/fault"
)

// Releases is what the failover app's moves need of the capacity store.
type Releases interface {
	HandOver(ctx context.Context, rental, node string) (capacity.Allocation, error)
	ReleaseOn(ctx context.Context, node string, rentals ...string) ([]bool, error)
}

// ReleasesUnderTest is a Releases with what the contract needs around it:
// Place gives rental an allocation on node (as the scheduler reserves),
// Held lists the rentals node holds an allocation of (live or handed
// over), sorted.
type ReleasesUnderTest struct {
	Releases Releases
	Place    func(t *testing.T, rental, node string)
	Held     func(t *testing.T, node string) []string
}

// RunReleasesContract checks what the failover app relies on of the
// capacity store's releases.
func RunReleasesContract(t *testing.T, open func(t *testing.T) ReleasesUnderTest) {
	held := func(t *testing.T, r ReleasesUnderTest, node string, want ...string) {
		t.Helper()
		if got := r.Held(t, node); !slices.Equal(got, want) {
			t.Fatalf("%s holds %v, want %v", node, got, want)
		}
	}
	t.Run("releasing on a node frees the rentals named there and leaves the rest", func(t *testing.T) {
		r := open(t)
		r.Place(t, "r1", "n1")
		r.Place(t, "r2", "n1")
		got, err := r.Releases.ReleaseOn(t.Context(), "n1", "r1")
		must(t, err)
		if !slices.Equal(got, []bool{true}) {
			t.Fatalf("released %v, want [true]", got)
		}
		held(t, r, "n1", "r2")
	})
	t.Run("releasing a rental held on another node leaves it there", func(t *testing.T) {
		r := open(t)
		r.Place(t, "r1", "n1")
		r.Place(t, "r2", "n2")
		got, err := r.Releases.ReleaseOn(t.Context(), "n2", "r1", "r2")
		must(t, err)
		if !slices.Equal(got, []bool{false, true}) {
			t.Fatalf("released %v, want [false true]", got)
		}
		held(t, r, "n1", "r1")
		held(t, r, "n2")
	})
	t.Run("a handed-over allocation stays held until it is released", func(t *testing.T) {
		r := open(t)
		r.Place(t, "r1", "n1")
		a, err := r.Releases.HandOver(t.Context(), "r1", "n1")
		must(t, err)
		if a.RentalID != "r1" || !a.HandingOver {
			t.Fatalf("handed over %+v", a)
		}
		if _, err := r.Releases.HandOver(t.Context(), "r1", "n1"); err != nil {
			t.Fatalf("a second hand-over (a redelivered notice): %v", err)
		}
		held(t, r, "n1", "r1")
		got, err := r.Releases.ReleaseOn(t.Context(), "n1", "r1")
		must(t, err)
		if !slices.Equal(got, []bool{true}) {
			t.Fatalf("released %v, want [true]", got)
		}
		held(t, r, "n1")
	})
	t.Run("handing over a rental the node does not hold is not found", func(t *testing.T) {
		r := open(t)
		r.Place(t, "r1", "n1")
		if _, err := r.Releases.HandOver(t.Context(), "gone", "n1"); !fault.IsNotFound(err) {
			t.Fatalf("hand-over of a rental that stopped: %v, want not found", err)
		}
	})
}

// Capacity is an in-memory Releases.
type Capacity struct {
	Calls
	mu    sync.Mutex
	nodes map[string]map[string]bool // node -> rental -> handed over
	// Released lists, per call of ReleaseOn, the node and the rentals
	// released.
	Released [][]string
}

// NewCapacity returns an empty store.
func NewCapacity() *Capacity { return &Capacity{nodes: map[string]map[string]bool{}} }

// Place gives rental a live allocation on node.
func (c *Capacity) Place(rental, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes[node] == nil {
		c.nodes[node] = map[string]bool{}
	}
	c.nodes[node][rental] = false
}

// Held lists the rentals node holds, sorted.
func (c *Capacity) Held(node string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.nodes[node]))
}

// HandOver marks the allocation handed over.
func (c *Capacity) HandOver(_ context.Context, rental, node string) (capacity.Allocation, error) {
	if err := c.call("HandOver"); err != nil {
		return capacity.Allocation{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.nodes[node][rental]; !ok {
		return capacity.Allocation{}, fault.NotFound("capacity: %s holds no allocation of %s", node, rental)
	}
	c.nodes[node][rental] = true
	return capacity.Allocation{Placement: capacity.Placement{RentalID: rental, NodeID: node}, HandingOver: true}, nil
}

// ReleaseOn frees what node holds of rentals.
func (c *Capacity) ReleaseOn(_ context.Context, node string, rentals ...string) ([]bool, error) {
	if err := c.call("ReleaseOn"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]bool, len(rentals))
	released := []string{node}
	for i, r := range rentals {
		if _, ok := c.nodes[node][r]; ok {
			delete(c.nodes[node], r)
			out[i] = true
			released = append(released, r)
		}
	}
	c.Released = append(c.Released, released)
	return out, nil
}
