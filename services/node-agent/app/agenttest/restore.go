package agenttest

import (
	"context"
	"fmt"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// ensureGeneration gives the store a generation if it has none; call
// with c.mu held.
func (c *Capacity) ensureGeneration() {
	if c.generation == "" {
		c.generation = fmt.Sprintf("gen-%d", c.lost+1)
	}
}

// Lose empties the store, as a Redis restarted without its data: no
// nodes, no generation.
func (c *Capacity) Lose() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes, c.generation = map[string]*storedNode{}, ""
	c.lost++
}

// Join is Register that also returns the generation.
func (c *Capacity) Join(ctx context.Context, n capacity.Node) (capacity.Registration, error) {
	epoch, err := c.Register(ctx, n)
	c.mu.Lock()
	defer c.mu.Unlock()
	return capacity.Registration{Epoch: epoch, Generation: c.generation}, err
}

// Generation returns the store's generation, "" when it has none.
func (c *Capacity) Generation(context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Generation"); err != nil {
		return "", err
	}
	return c.generation, nil
}

// Restore writes a lost node back with its placements at in.Epoch; a
// rental another node holds is lost (the fake keeps no attempts); a node
// held at another epoch or dead is left as it is.
func (c *Capacity) Restore(_ context.Context, in capacity.RestoreInput) (capacity.RestoreResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.call("Restore"); err != nil {
		return capacity.RestoreResult{}, err
	}
	if err := in.Validate(); err != nil {
		return capacity.RestoreResult{}, fmt.Errorf("capacity: restore node %s: %w", in.Node.ID, err)
	}
	c.ensureGeneration()
	out := capacity.RestoreResult{Registration: capacity.Registration{Epoch: in.Epoch, Generation: c.generation}}
	s := c.nodes[in.Node.ID]
	if s != nil && (s.status == capacity.StatusDead || s.epoch != in.Epoch) {
		out.Epoch = s.epoch
		return out, nil
	}
	if s == nil {
		s = &storedNode{node: in.Node, status: capacity.StatusReady, epoch: in.Epoch, allocs: map[string]uint64{}}
		if in.Draining {
			s.status = capacity.StatusDraining
		}
		c.nodes[in.Node.ID] = s
	}
	for _, p := range in.Placements {
		if holder := c.holder(p.RentalID); holder != "" && holder != in.Node.ID {
			out.Lost = append(out.Lost, capacity.LostRental{RentalID: p.RentalID, NodeID: holder})
			continue
		}
		s.allocs[p.RentalID] = in.Epoch
	}
	out.Restored = true
	return out, nil
}

// holder is the node that holds rental, ""; call with c.mu held.
func (c *Capacity) holder(rental string) string {
	for id, s := range c.nodes {
		if _, ok := s.allocs[rental]; ok {
			return id
		}
	}
	return ""
}
