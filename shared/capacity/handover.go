package capacity

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A hand-over lets a rental hold two allocations for a while, on two
// nodes: the run it is leaving (a spot node about to be reclaimed) and the
// next attempt placed elsewhere, so the next attempt can start before the
// old run stops (make-before-break).
//
// HandOver takes the old allocation out of the rental index and marks the
// node's copy handed over: it keeps its capacity on its node and the
// node's agent can still renew it, but for everyone else the rental now
// has no allocation (Allocation says not found), so Reserve places the
// next attempt as a new one. ReleaseOn gives the old copy back once the
// old run has stopped (or its node is fenced). No capacity is counted
// twice: each copy is taken from its own node. Reserve refuses a node that
// still holds the rental's handed-over copy (ErrConflict): a node holds
// at most one allocation of a rental.
//
// The node's copy is marked by a leading "handover":true field in its JSON
// (added and checked as text, so the rest of the record stays exactly as
// Reserve wrote it).

// handOverScript moves a rental's allocation on a node out of the index.
//
// KEYS: allocs, rentals, version, usage. ARGV: rental id. The rental
// leaves the index, and so its tenant's usage (quota.go).
// Reply: {'ok', record} (handed over now or before), {'none'} (the node
// holds no allocation of the rental), {'elsewhere'} (the index names
// another record: the node's copy is not the rental's live allocation).
var handOverScript = redis.NewScript(luaHelpers + luaUsage + `
local rec = redis.call('HGET', KEYS[1], ARGV[1])
if not rec then return {'none'} end
if string.sub(rec, 1, 17) == '{"handover":true,' then return {'ok', rec} end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= rec then return {'elsewhere'} end
local out = '{"handover":true,' .. string.sub(rec, 2)
redis.call('HSET', KEYS[1], ARGV[1], out)
redis.call('HDEL', KEYS[2], ARGV[1])
usage(KEYS[4], cjson.decode(rec), -1)
redis.call('INCR', KEYS[3])
return {'ok', out}
`)

// HandOver marks the rental's allocation on nodeID as its previous run's:
// see the comment at the top of this file. It is idempotent (a copy handed
// over already is returned again). Errors: ErrNotFound when the node holds
// no allocation of the rental, ErrConflict when the rental's live
// allocation is not the one on that node.
func (s *Store) HandOver(ctx context.Context, rentalID, nodeID string) (Allocation, error) {
	op := fmt.Sprintf("hand over rental %s on node %s", rentalID, nodeID)
	var p problems
	p.id("rentalID", rentalID)
	p.id("nodeID", nodeID)
	if err := invalid(p...); err != nil {
		return Allocation{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	res, err := s.run(ctx, op, handOverScript, []string{s.keys.allocs(nodeID), s.keys.rentals(), s.keys.version(), s.keys.usage()}, rentalID)
	if err != nil {
		return Allocation{}, err
	}
	switch str(res[0]) {
	case "ok":
		a, err := decodeAllocation(str(res[1]))
		if err != nil {
			return Allocation{}, fmt.Errorf("capacity: %s: %w", op, err)
		}
		return a, nil
	case "none":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: the node holds no allocation of the rental", op, ErrNotFound)
	case "elsewhere":
		return Allocation{}, fmt.Errorf("capacity: %s: %w: the rental's live allocation is another", op, ErrConflict)
	}
	return Allocation{}, unexpected(op, res)
}

// ReleaseOn gives back the allocations that nodeID holds of rentalIDs
// (live or handed over), in one pipelined round trip, and reports which
// it released. A rental whose allocation is on another node is left alone,
// so a caller that saw a rental on a node it lost may release "what is
// still there" without first asking where each rental is.
func (s *Store) ReleaseOn(ctx context.Context, nodeID string, rentalIDs ...string) ([]bool, error) {
	return s.releaseOn(ctx, nodeID, "", rentalIDs)
}

// ReleaseHandedOver gives back the handed-over copies that nodeID holds of
// rentalIDs (see HandOver), in one pipelined round trip, and reports which
// it released; live allocations are left alone.
func (s *Store) ReleaseHandedOver(ctx context.Context, nodeID string, rentalIDs ...string) ([]bool, error) {
	return s.releaseOn(ctx, nodeID, "handover", rentalIDs)
}

func (s *Store) releaseOn(ctx context.Context, nodeID, only string, rentalIDs []string) ([]bool, error) {
	op := fmt.Sprintf("release %d rentals on node %s", len(rentalIDs), nodeID)
	var p problems
	p.id("nodeID", nodeID)
	for _, id := range rentalIDs {
		p.id("rentalID", id)
	}
	if err := invalid(p...); err != nil {
		return nil, fmt.Errorf("capacity: %s: %w", op, err)
	}
	if len(rentalIDs) == 0 {
		return nil, nil
	}
	keys := []string{s.keys.node(nodeID), s.keys.allocs(nodeID), s.keys.rentals(), s.keys.version(), s.keys.usage()}
	cmds := make([]*redis.Cmd, len(rentalIDs))
	run := func() error {
		_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, id := range rentalIDs {
				cmds[i] = releaseScript.EvalSha(ctx, pipe, keys, id, nodeID, only)
			}
			return nil
		})
		return err
	}
	err := run()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// EVALSHA in a pipeline does not fall back to EVAL: load the
		// script (after a Redis restart or SCRIPT FLUSH) and go again.
		if err = releaseScript.Load(ctx, s.rdb).Err(); err == nil {
			err = run()
		}
	}
	if err != nil {
		return nil, unavailable(op, err)
	}
	out := make([]bool, len(rentalIDs))
	for i, c := range cmds {
		res, err := c.Slice()
		if err != nil || len(res) == 0 {
			return nil, unavailable(op, fmt.Errorf("rental %s: %w", rentalIDs[i], err))
		}
		out[i] = str(res[0]) == "ok"
	}
	return out, nil
}
