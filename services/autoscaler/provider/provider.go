// Package provider is how the autoscaler gets and gives back GPU nodes. A
// Provider provisions nodes of an instance type on a market in a zone,
// releases one, and lists what it runs. Real clouds are future providers
// behind the same interface; Local starts simulated node-agents as child
// processes, for tests and `shizu dev`.
package provider

import (
	"context"
	"errors"
	"time"

	"github.com/shizu-gpu/shizu/shared/fault"
	"github.com/shizu-gpu/shizu/shared/rent"
)

// Market is how a node is bought ("on-demand" or "spot"): Shizu's one
// market vocabulary, shared/rent.
type Market = rent.Market

// Markets.
const (
	OnDemand = rent.OnDemand
	Spot     = rent.Spot
)

// Node is one node a provider runs.
type Node struct {
	ID           string
	InstanceType string
	Market       Market
	Zone         string
	CreatedAt    time.Time
}

// Provider provisions and releases nodes. Implementations are safe for
// concurrent use.
type Provider interface {
	// Provision starts n nodes and returns their ids. It provisions all or
	// nothing; ErrInsufficientCapacity means the market has no room now.
	// n < 1 is invalid input (fault.IsInvalid, see CheckCount), never
	// "no nodes and no error".
	Provision(ctx context.Context, instanceType string, market Market, zone string, n int) ([]string, error)
	// Release stops a node; releasing an unknown or released node is not
	// an error (it is idempotent).
	Release(ctx context.Context, node string) error
	// List returns the nodes running, sorted by id.
	List(ctx context.Context) ([]Node, error)
}

// ErrInsufficientCapacity: the provider cannot supply the nodes now (for
// spot, a shortage in the market).
var ErrInsufficientCapacity = errors.New("insufficient capacity")

// ErrUnknownInstanceType: the provider does not sell this type.
var ErrUnknownInstanceType = errors.New("unknown instance type")

// CheckCount is the check every Provision makes first: asking for fewer
// than one node is invalid input.
func CheckCount(n int) error {
	if n < 1 {
		return fault.Invalid("provision: count %d; must be at least 1", n)
	}
	return nil
}
