package capacity

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/shared/rent"
)

// GPUHealth is whether a GPU takes new work, as its node agent last
// reported it (NodeHealthChanged for one GPU); shared/rent maps it to and
// from the event contract (rent.HealthOf).
type GPUHealth = rent.Health

// GPU health states. Only a healthy GPU takes new reservations; a degraded
// one keeps what it runs, a failed one's rentals are moved by failover.
const (
	HealthHealthy  = rent.Healthy
	HealthDegraded = rent.Degraded
	HealthFailed   = rent.Failed
)

// SetGPUHealth records the health of GPU gpu of a node registered at
// epoch. A GPU that is not healthy takes no new reservation (Reserve fails
// with ErrConflict) until it is reported healthy again; what it already
// holds stays. The mark is kept when the node registers again. changed is
// false when the GPU already had that health.
//
// Errors: ErrInvalid (bad arguments, or the node has no such GPU),
// ErrNotFound (no such node), ErrFenced (the node is dead or at another
// epoch: the report is about an older registration).
func (s *Store) SetGPUHealth(ctx context.Context, nodeID string, epoch uint64, gpu int, h GPUHealth) (changed bool, err error) {
	op := fmt.Sprintf("set GPU %d of node %s %s", gpu, nodeID, h)
	var p problems
	p.id("nodeID", nodeID)
	checkEpoch(&p, "epoch", epoch)
	if gpu < 0 || gpu >= MaxGPUsPerNode {
		p.addf("gpu", "must be in 0..%d, got %d", MaxGPUsPerNode-1, gpu)
	}
	if h != HealthHealthy && h != HealthDegraded && h != HealthFailed {
		p.addf("health", "must be %q, %q or %q, got %q", HealthHealthy, HealthDegraded, HealthFailed, h)
	}
	if err := invalid(p...); err != nil {
		return false, fmt.Errorf("capacity: %s: %w", op, err)
	}
	res, err := s.run(ctx, op, gpuHealthScript, []string{s.keys.node(nodeID), s.keys.version()}, epoch, gpu, string(h))
	if err != nil {
		return false, err
	}
	switch str(res[0]) {
	case "ok":
		return num(res[1]) == 1, nil
	case "not_found":
		return false, fmt.Errorf("capacity: %s: %w: no such node", op, ErrNotFound)
	case "dead":
		return false, fmt.Errorf("capacity: %s: %w: node is dead at epoch %s", op, ErrFenced, str(res[1]))
	case "epoch":
		return false, fmt.Errorf("capacity: %s: %w: node is at epoch %s, report is about %d", op, ErrFenced, str(res[1]), epoch)
	case "no_gpu":
		return false, fmt.Errorf("capacity: %s: %w: node has %s GPUs", op, ErrInvalid, str(res[1]))
	}
	return false, unexpected(op, res)
}

// gpuHealthScript sets or clears one GPU's health mark (field
// g<i>.health; absent means healthy).
//
// KEYS: node, version. ARGV: epoch, GPU index, health.
// Reply: {'ok', changed 0|1}, {'not_found'}, {'dead', epoch},
// {'epoch', epoch}, {'no_gpu', count}.
var gpuHealthScript = redis.NewScript(`
local field = 'g' .. ARGV[2] .. '.health'
local v = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'gpus', field)
if not v[1] then return {'not_found'} end
if v[1] == 'dead' then return {'dead', v[2]} end
if tonumber(v[2]) ~= tonumber(ARGV[1]) then return {'epoch', v[2]} end
if tonumber(ARGV[2]) >= tonumber(v[3]) then return {'no_gpu', v[3]} end
local cur = v[4] or 'healthy'
if cur == ARGV[3] then return {'ok', 0} end
if ARGV[3] == 'healthy' then
  redis.call('HDEL', KEYS[1], field)
else
  redis.call('HSET', KEYS[1], field, ARGV[3])
end
redis.call('INCR', KEYS[2])
return {'ok', 1}
`)
