package records

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shizu-gpu/shizu/services/scheduler/ports"
)

// preemptJSON is a preemption as stored under its victim.
type preemptJSON struct {
	Tenant    string    `json:"tenant"`
	Preemptor string    `json:"preemptor"`
	Node      string    `json:"node"`
	Epoch     uint64    `json:"epoch"`
	Notice    time.Time `json:"notice"`
	StopSent  bool      `json:"stop_sent,omitempty"`
}

// claimPreemption takes every victim (ARGV pairs victim, record) for one
// preemptor (ARGV[1]) or none: it returns the victims held for another.
var claimPreemption = redis.NewScript(`
local taken = {}
for i = 2, #ARGV, 2 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held and cjson.decode(held).preemptor ~= ARGV[1] then
    table.insert(taken, ARGV[i])
  end
end
if #taken > 0 then return taken end
for i = 2, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return taken
`)

// stopSent marks a victim's record, if it is still there.
var stopSent = redis.NewScript(`
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local rec = cjson.decode(held)
rec.stop_sent = true
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
return 1
`)

// ClaimPreemption implements ports.OutcomeRecords.
func (r *Redis) ClaimPreemption(ctx context.Context, ps []ports.Preemption) ([]string, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	args := []any{ps[0].Preemptor}
	for _, p := range ps {
		if p.Preemptor != ps[0].Preemptor {
			return nil, fmt.Errorf("scheduler records: one preemption claim names preemptors %s and %s", ps[0].Preemptor, p.Preemptor)
		}
		raw, err := json.Marshal(preemptJSON{Tenant: p.Tenant, Preemptor: p.Preemptor, Node: p.NodeID, Epoch: p.NodeEpoch, Notice: p.Notice.UTC()})
		if err != nil {
			return nil, fmt.Errorf("encode preemption of %s: %w", p.Victim, err)
		}
		args = append(args, p.Victim, raw)
	}
	taken, err := claimPreemption.Run(ctx, r.rdb, []string{r.preemptKey()}, args...).StringSlice()
	if err != nil {
		return nil, unavailable("claim preemption", err)
	}
	return taken, nil
}

// Preemptions implements ports.OutcomeRecords. A record that does not
// decode is left out (and logged by nobody: it cannot be told apart from
// a victim whose stop is handled; DropPreemption removes it with its
// victim).
func (r *Redis) Preemptions(ctx context.Context) ([]ports.Preemption, error) {
	all, err := r.rdb.HGetAll(ctx, r.preemptKey()).Result()
	if err != nil {
		return nil, unavailable("read preemptions", err)
	}
	out := make([]ports.Preemption, 0, len(all))
	for victim, raw := range all {
		var p preemptJSON
		if json.Unmarshal([]byte(raw), &p) != nil {
			continue
		}
		out = append(out, ports.Preemption{Victim: victim, Tenant: p.Tenant, Preemptor: p.Preemptor, NodeID: p.Node,
			NodeEpoch: p.Epoch, Notice: p.Notice, StopSent: p.StopSent})
	}
	return out, nil
}

// StopSent implements ports.OutcomeRecords.
func (r *Redis) StopSent(ctx context.Context, victim string) error {
	if err := stopSent.Run(ctx, r.rdb, []string{r.preemptKey()}, victim).Err(); err != nil {
		return unavailable("mark stop sent", err)
	}
	return nil
}

// DropPreemption implements ports.OutcomeRecords.
func (r *Redis) DropPreemption(ctx context.Context, victims ...string) error {
	if len(victims) == 0 {
		return nil
	}
	if err := r.rdb.HDel(ctx, r.preemptKey(), victims...).Err(); err != nil {
		return unavailable("drop preemptions", err)
	}
	return nil
}
