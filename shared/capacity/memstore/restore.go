package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/shizu-gpu/shizu/shared/capacity"
)

// ensureGeneration creates the store's generation if it has none; call
// with s.mu held.
func (s *Store) ensureGeneration() {
	if s.generation == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		s.generation = hex.EncodeToString(b)
	}
}

// Generation reads the store's generation, as capacity.Store.Generation.
func (s *Store) Generation(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.generation, nil
}

// Restore puts a lost node back with its allocations, as
// capacity.Store.Restore does.
func (s *Store) Restore(_ context.Context, in capacity.RestoreInput) (capacity.RestoreResult, error) {
	op := fmt.Sprintf("restore node %s at epoch %d", in.Node.ID, in.Epoch)
	if err := in.Validate(); err != nil {
		return capacity.RestoreResult{}, invalid(op, err)
	}
	spec := cloneNode(in.Node)
	key, err := json.Marshal(spec)
	if err != nil {
		return capacity.RestoreResult{}, invalid(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ensureGeneration()
	out := capacity.RestoreResult{Registration: capacity.Registration{Epoch: in.Epoch, Generation: s.generation}}
	status := capacity.StatusReady
	if in.Draining {
		status = capacity.StatusDraining
	}
	cur, known := s.nodes[in.Node.ID]
	allocs := map[string]*capacity.Allocation{}
	health := map[int]capacity.GPUHealth{}
	if known {
		if cur.status == capacity.StatusDead || cur.epoch != in.Epoch {
			out.Epoch = cur.epoch
			return out, nil
		}
		status, allocs, health = cur.status, maps.Clone(cur.allocs), cur.health
	}
	var overtaken, added []*capacity.Allocation
	for _, p := range in.Placements {
		if allocs[p.RentalID] != nil {
			continue
		}
		if held, ok := s.index[p.RentalID]; ok && held.NodeID != in.Node.ID {
			if held.Attempt >= p.Attempt {
				out.Lost = append(out.Lost, capacity.LostRental{RentalID: p.RentalID, NodeID: held.NodeID, Attempt: held.Attempt})
				continue
			}
			overtaken = append(overtaken, held)
		}
		a := &capacity.Allocation{Placement: p, CreatedAt: s.now().UTC().Round(0)}
		a.GPUs = slices.Clone(p.GPUs)
		a.Quota = nil
		allocs[p.RentalID] = a
		added = append(added, a)
	}
	health = maps.Clone(health)
	for i, h := range in.Health {
		if h != capacity.HealthHealthy {
			health[i] = h
		}
	}
	if why := misfit(spec, allocs); why != "" {
		return capacity.RestoreResult{}, fail(op, capacity.ErrConflict, "live allocations do not fit the new facts (%s); release them first", why)
	}
	for _, held := range overtaken {
		if n, ok := s.nodes[held.NodeID]; ok {
			delete(n.allocs, held.RentalID)
		}
		delete(s.models, held)
	}
	for _, a := range added {
		if old, ok := s.index[a.RentalID]; ok {
			delete(s.models, old)
		}
		s.models[a] = modelsOn(spec, a.Placement)
	}
	for id, a := range allocs {
		if !a.HandingOver {
			s.index[id] = a
		}
	}
	s.nodes[in.Node.ID] = &node{spec: spec, specKey: string(key), status: status, epoch: in.Epoch, health: health, allocs: allocs}
	s.version++
	out.Restored = true
	return out, nil
}
