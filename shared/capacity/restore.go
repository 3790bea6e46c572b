package capacity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A Redis that restarts without its data (no persistence, a replaced
// primary) comes back empty. The store's generation tells its clients so:
// an opaque random id, created by the first registration (Join, Register)
// or Restore into a store that has none. A node agent remembers the
// generation it registered in; when the store's is absent or another, the
// store it registered in is gone, and the agent restores its node together
// with the allocations of the workloads it runs (Restore), instead of
// taking the missing allocations for released ones and stopping the
// workloads.

// Registration is a node's place in a store: its epoch and the store's
// generation it was registered in.
type Registration struct {
	Epoch      uint64
	Generation string
}

// RestoreInput is a node as its agent knows it after the store was lost:
// its facts, the epoch it holds (kept, so fencing tokens never go back),
// whether it was draining, and the placements of the workloads it runs.
type RestoreInput struct {
	Node     Node
	Epoch    uint64
	Draining bool
	// Placements are on Node at Epoch; Attempt decides which node keeps a
	// rental that two nodes restore (a rental moved while the store was
	// lost).
	Placements []Placement
	// Health is the GPUs the agent knows are not healthy (by index), so
	// that the restored node takes no new work on them (SetGPUHealth).
	Health map[int]GPUHealth
}

// RestoreResult is what Restore did.
type RestoreResult struct {
	Registration
	// Restored is false when the store already holds the node at another
	// epoch or dead (fenced since): nothing was written, and the agent's
	// usual reconciliation (Renew, fenced: stop) applies.
	Restored bool
	// Lost are the input's rentals that another node holds under the
	// same or a later attempt: not written here; this node's copy must
	// stop.
	Lost []LostRental
}

// LostRental is a rental another node holds.
type LostRental struct {
	RentalID string
	NodeID   string // the node that holds it
	Attempt  int32  // the attempt that node holds
}

// newGeneration is a fresh random generation id.
func newGeneration() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// Generation reads the store's generation; "" when the store has none (an
// empty Redis, before any registration).
func (s *Store) Generation(ctx context.Context) (string, error) {
	g, err := s.rdb.Get(ctx, s.keys.generation()).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", unavailable("read generation", err)
	}
	return g, nil
}

// Validate reports every problem with the input.
func (in RestoreInput) Validate() error {
	var p problems
	checkEpoch(&p, "Epoch", in.Epoch)
	if err := in.Node.Validate(); err != nil {
		p.addf("Node", "%v", err)
	}
	for i, h := range in.Health {
		if i < 0 || i >= len(in.Node.GPUs) {
			p.addf("Health", "GPU %d: the node has %d GPUs", i, len(in.Node.GPUs))
		}
		if h != HealthHealthy && h != HealthDegraded && h != HealthFailed {
			p.addf("Health", "GPU %d: %q is not a health", i, h)
		}
	}
	seen := map[string]bool{}
	for i, pl := range in.Placements {
		f := fmt.Sprintf("Placements[%d]", i)
		if err := pl.Validate(); err != nil {
			p.addf(f, "%v", err)
		}
		if pl.NodeID != in.Node.ID || pl.Epoch != in.Epoch {
			p.addf(f, "is on node %s at epoch %d, not the restored node %s at epoch %d", pl.NodeID, pl.Epoch, in.Node.ID, in.Epoch)
		}
		if seen[pl.RentalID] {
			p.addf(f, "rental %s is listed twice", pl.RentalID)
		}
		seen[pl.RentalID] = true
	}
	return invalid(p...)
}

// Restore puts a node back into a store that lost it, together with its
// allocations, in one atomic step: the node never shows up empty, so no
// scheduler places onto GPUs that are in use. It creates the generation
// when there is none and returns it.
//
// When the store does not hold the node, it is written at in.Epoch (ready,
// or draining), holding every placement no other node holds. When it holds
// it at in.Epoch and alive (a Restore whose reply was lost), the placements
// it lacks are added. When it holds it at another epoch or dead, nothing
// is written (Restored false).
//
// A placement whose rental another node holds is written only when its
// attempt is higher: the other node's copy is then released (its agent's
// next Renew finds it gone). Otherwise the rental is in Lost.
//
// Errors: ErrInvalid (in fails Validate), ErrConflict (the placements do
// not fit the node's facts; nothing is written).
func (s *Store) Restore(ctx context.Context, in RestoreInput) (RestoreResult, error) {
	op := fmt.Sprintf("restore node %s at epoch %d", in.Node.ID, in.Epoch)
	if err := in.Validate(); err != nil {
		return RestoreResult{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	args, err := registerArgs(in.Node)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("capacity: %s: %w", op, err)
	}
	status := StatusReady
	if in.Draining {
		status = StatusDraining
	}
	args = append(args, in.Epoch, string(status), newGeneration(), len(in.Placements))
	created := s.now().UTC()
	for _, pl := range in.Placements {
		raw, err := encodeAllocation(pl, created, modelsOf(in.Node, pl)...)
		if err != nil {
			return RestoreResult{}, fmt.Errorf("capacity: %s: %w", op, err)
		}
		args = append(args, pl.RentalID, raw, pl.Attempt, "")
	}
	args = append(args, healthArgs(in.Health)...)
	for range maxReleaseHops {
		keys, err := s.restoreKeys(ctx, op, in, args)
		if err != nil {
			return RestoreResult{}, err
		}
		res, err := s.run(ctx, op, restoreScript, keys, args...)
		if err != nil {
			return RestoreResult{}, err
		}
		if str(res[0]) == "moved" {
			continue
		}
		return restoreOutcome(op, res)
	}
	return RestoreResult{}, fmt.Errorf("capacity: %s: %w: rentals moved between nodes %d times while being restored", op, ErrConflict, maxReleaseHops)
}

// restoreKeys reads which node the index names for each placement's
// rental, writes it into args (the script checks it has not changed) and
// returns the script's keys: this node's, the store-wide ones, then the
// node and allocs keys of each placement's holder (this node's when none).
func (s *Store) restoreKeys(ctx context.Context, op string, in RestoreInput, args []any) ([]string, error) {
	keys := []string{s.keys.node(in.Node.ID), s.keys.allocs(in.Node.ID), s.keys.nodes(), s.keys.version(),
		s.keys.rentals(), s.keys.generation()}
	if len(in.Placements) == 0 {
		return append(keys, s.keys.usage()), nil
	}
	ids := make([]string, len(in.Placements))
	for i, pl := range in.Placements {
		ids[i] = pl.RentalID
	}
	vals, err := s.rdb.HMGet(ctx, s.keys.rentals(), ids...).Result()
	if err != nil {
		return nil, unavailable(op, err)
	}
	first := len(args) - 4*len(in.Placements) - len(healthArgs(in.Health))
	for i, v := range vals {
		holder := in.Node.ID
		if raw, ok := v.(string); ok {
			a, err := decodeAllocation(raw)
			if err != nil {
				return nil, fmt.Errorf("capacity: %s: %w", op, err)
			}
			holder = a.NodeID
		}
		args[first+4*i+3] = ""
		if holder != in.Node.ID {
			args[first+4*i+3] = holder
		}
		keys = append(keys, s.keys.node(holder), s.keys.allocs(holder))
	}
	return append(keys, s.keys.usage()), nil
}

// modelsOf is the model of each GPU share of pl on n, as Reserve records
// it (quota.go): none when n's GPUs name none.
func modelsOf(n Node, pl Placement) []string {
	out := make([]string, len(pl.GPUs))
	named := false
	for i, g := range pl.GPUs {
		if g.Index < len(n.GPUs) {
			out[i] = n.GPUs[g.Index].Model
			named = named || out[i] != ""
		}
	}
	if !named {
		return nil
	}
	return out
}

// healthArgs are the restore script's health arguments: the count of
// GPUs marked, then (index, health) of each, in index order.
func healthArgs(h map[int]GPUHealth) []any {
	out := []any{0}
	for _, i := range slices.Sorted(maps.Keys(h)) {
		if h[i] != HealthHealthy {
			out = append(out, i, string(h[i]))
		}
	}
	out[0] = (len(out) - 1) / 2
	return out
}

// restoreOutcome maps the restore script's reply to Restore's result.
func restoreOutcome(op string, res []any) (RestoreResult, error) {
	switch str(res[0]) {
	case "ok", "registered":
		epoch, err := strconv.ParseUint(str(res[1]), 10, 64)
		if err != nil {
			return RestoreResult{}, fmt.Errorf("capacity: %s: epoch: %w", op, err)
		}
		out := RestoreResult{Registration: Registration{Epoch: epoch, Generation: str(res[3])}, Restored: str(res[0]) == "ok"}
		if len(res) > 4 {
			lost, _ := res[4].([]any)
			for i := 0; i+2 < len(lost); i += 3 {
				out.Lost = append(out.Lost, LostRental{RentalID: str(lost[i]), NodeID: str(lost[i+1]), Attempt: int32(num(lost[i+2]))})
			}
		}
		return out, nil
	case "misfit":
		return RestoreResult{}, misfitError(op, res)
	}
	return RestoreResult{}, unexpected(op, res)
}

// restoreScript writes a lost node back with its allocations (Restore).
//
// KEYS: node, allocs, nodes, version, rentals, generation, then for each
// placement j the node and allocs keys of the node the caller found
// holding its rental (this node's own when none), and last the usage
// hash: what the script indexes is added to its tenant's usage, an index
// entry it replaces taken away (quota.go).
// ARGV: register's layout (registerScript, without its generation), then
// epoch, status, a new generation id, the placement count k, and k groups
// of (rental id, allocation JSON, attempt, the holder the caller found or
// an empty string for none or this node), then the count h of GPUs marked
// not healthy and h pairs (GPU index, health).
// Reply: {'ok', epoch, status, generation, {lost: rental, node, attempt,
// ...}}, {'registered', epoch, status, generation} (the store holds the
// node at another epoch or dead: nothing written), {'moved', rental} (the
// index changed since the caller read it: read again), or
// {'misfit', ...} as registerScript.
var restoreScript = redis.NewScript(luaHelpers + luaFit + luaUsage + `
local o = 6 + 3 * tonumber(ARGV[5])
o = o + 1 + 3 * tonumber(ARGV[o])
local epoch, status, k = ARGV[o], ARGV[o + 1], tonumber(ARGV[o + 3])
redis.call('SET', KEYS[6], ARGV[o + 2], 'NX')
local gen = redis.call('GET', KEYS[6])
local cur = redis.call('HMGET', KEYS[1], 'status', 'epoch')
if cur[1] then
  if cur[1] == 'dead' or tonumber(cur[2]) ~= tonumber(epoch) then return {'registered', cur[2], cur[1], gen} end
  status = cur[1]
end
local raws = redis.call('HVALS', KEYS[2])
local take, overtake, lost = {}, {}, {}
for j = 1, k do
  local b = o + 4 * j
  local id, attempt, hint = ARGV[b], tonumber(ARGV[b + 2]), ARGV[b + 3]
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    local idx = redis.call('HGET', KEYS[5], id)
    local holder, theirs = '', 0
    if idx then
      local a = cjson.decode(idx)
      holder, theirs = a.node_id, a.attempt or 0
    end
    if holder == ARGV[1] then holder = '' end
    if holder ~= hint then return {'moved', id} end
    if holder == '' then
      take[#take + 1] = j
    elseif theirs >= attempt then
      lost[#lost + 1] = id; lost[#lost + 1] = holder; lost[#lost + 1] = fmt(theirs)
    else
      take[#take + 1] = j; overtake[#overtake + 1] = j
    end
  end
end
for _, j in ipairs(take) do raws[#raws + 1] = ARGV[o + 4 * j + 1] end
local f, misfit = fit(raws, status, epoch)
if not f then return misfit end
local hb = o + 4 * k + 4
for q = 1, tonumber(ARGV[hb]) do
  f[#f + 1] = 'g' .. ARGV[hb + 2 * q - 1] .. '.health'; f[#f + 1] = ARGV[hb + 2 * q]
end
-- A lower attempt held elsewhere gives its capacity back on its node.
for _, j in ipairs(overtake) do
  local nk, ak, id = KEYS[5 + 2 * j], KEYS[6 + 2 * j], ARGV[o + 4 * j]
  local rec = redis.call('HGET', ak, id)
  if rec then
    local a = cjson.decode(rec)
    local fields = {'cpu_free', 'mem_free'}
    for _, g in ipairs(a.gpus) do
      local p = 'g' .. fmt(g.index) .. '.'
      fields[#fields + 1] = p .. 'milli'
      fields[#fields + 1] = p .. 'vram'
      fields[#fields + 1] = p .. 'sharers'
      fields[#fields + 1] = p .. 'mi.' .. (g.mig_instance or '')
    end
    local v = redis.call('HMGET', nk, unpack(fields))
    if v[1] then
      local set = {'cpu_free', fmt(tonumber(v[1]) + a.cpu_milli), 'mem_free', fmt(tonumber(v[2]) + a.memory_mib)}
      for q, g in ipairs(a.gpus) do
        local e = 4 * q - 1
        set[#set + 1] = fields[e]; set[#set + 1] = fmt(tonumber(v[e]) + g.milli)
        set[#set + 1] = fields[e + 1]; set[#set + 1] = fmt(tonumber(v[e + 1]) + g.vram_mib)
        set[#set + 1] = fields[e + 2]; set[#set + 1] = fmt(tonumber(v[e + 2]) - 1)
        if g.mig_instance and v[e + 3] == id then set[#set + 1] = fields[e + 3]; set[#set + 1] = '' end
      end
      redis.call('HSET', nk, unpack(set))
    end
    redis.call('HDEL', ak, id)
  end
end
for _, j in ipairs(take) do
  local id, rec = ARGV[o + 4 * j], ARGV[o + 4 * j + 1]
  local old = redis.call('HGET', KEYS[5], id)
  if old then usage(KEYS[#KEYS], cjson.decode(old), -1) end
  usage(KEYS[#KEYS], cjson.decode(rec), 1)
  redis.call('HSET', KEYS[2], id, rec)
  redis.call('HSET', KEYS[5], id, rec)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(f))
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('INCR', KEYS[4])
return {'ok', epoch, status, gen, lost}
`)
