package capacity

import (
	"context"
	"fmt"
	"strconv"
)

// Register records a node, as its agent reports it, and returns the node's
// epoch. A new node starts at epoch 1, ready, with everything free. A known
// node keeps its epoch and its allocations and takes the new static facts;
// a draining node stays draining and a dead (fenced) node becomes ready
// again at its current, already moved, epoch. What is free is recomputed
// from the new facts minus the live allocations; when those no longer fit
// (a GPU disappeared, VRAM shrank, MaxSharers dropped below the sharers)
// Register fails with ErrConflict and changes nothing.
func (s *Store) Register(ctx context.Context, n Node) (uint64, error) {
	reg, err := s.Join(ctx, n)
	return reg.Epoch, err
}

// Join is Register that also returns the store's generation (see
// Generation), read in the same atomic step: the generation the node is
// registered in. It creates the generation when the store has none.
func (s *Store) Join(ctx context.Context, n Node) (Registration, error) {
	op := "register node " + n.ID
	args, err := registerArgs(n)
	if err != nil {
		return Registration{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	args = append(args, newGeneration())
	res, err := s.run(ctx, op, registerScript,
		[]string{s.keys.node(n.ID), s.keys.allocs(n.ID), s.keys.nodes(), s.keys.version(), s.keys.generation()}, args...)
	if err != nil {
		return Registration{}, err
	}
	switch str(res[0]) {
	case "ok":
		epoch, err := strconv.ParseUint(str(res[1]), 10, 64)
		if err != nil {
			return Registration{}, fmt.Errorf("capacity: %s: epoch: %w", op, err)
		}
		return Registration{Epoch: epoch, Generation: str(res[4])}, nil
	case "misfit":
		return Registration{}, misfitError(op, res)
	}
	return Registration{}, unexpected(op, res)
}

// registerArgs validates n and encodes it as the register script's
// arguments (see registerScript), without the generation.
func registerArgs(n Node) ([]any, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	spec, err := encodeNode(n)
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, 7+3*len(n.GPUs))
	args = append(args, n.ID, spec, n.CPUMilli, n.MemoryMiB, len(n.GPUs))
	var instances []any
	for _, g := range n.GPUs {
		args = append(args, g.VRAMMiB, g.EffectiveMaxSharers(), flag(g.MIGEnabled))
		for _, m := range g.MIGInstances {
			instances = append(instances, g.Index, m.UUID, m.Profile)
		}
	}
	args = append(args, len(instances)/3)
	return append(args, instances...), nil
}

// misfitError is the ErrConflict of a 'misfit' script reply: live
// allocations that do not fit a node's facts.
func misfitError(op string, res []any) error {
	rental, resource, gpu, value := str(res[1]), str(res[2]), str(res[3]), str(res[4])
	var what string
	switch resource {
	case "gpu":
		what = fmt.Sprintf("rental %s uses GPU %s but the node now has %s GPUs", rental, gpu, value)
	case "mig":
		what = fmt.Sprintf("rental %s holds MIG slice %s on GPU %s, which is no longer in MIG mode", rental, value, gpu)
	case "mig_mode":
		what = fmt.Sprintf("rental %s time-shares GPU %s, which is now in MIG mode", rental, gpu)
	case "mig_instance":
		what = fmt.Sprintf("rental %s holds MIG instance %s on GPU %s, which no longer has it", rental, value, gpu)
	default:
		where := "the host"
		if gpu != "-1" {
			where = "GPU " + gpu
		}
		what = fmt.Sprintf("%s would have %s %s free", where, value, resource)
	}
	return fmt.Errorf("capacity: %s: %w: live allocations do not fit the new facts (%s); release them first", op, ErrConflict, what)
}
