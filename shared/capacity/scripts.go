package capacity

import "github.com/redis/go-redis/v9"

// The store's Lua scripts. Each declares every key it touches in KEYS and
// writes only after all of its checks pass, so a rejected call changes
// nothing. The scripts that change capacity read every field they need with
// one HMGET and write them back with one HSET: in Redis 7 each redis.call
// costs about a microsecond, so the number of calls, not their size, is what
// a script costs. Numbers are written with string.format('%d', x): Lua
// numbers are doubles and would otherwise print as "1e+15" or "-0".
// The first element of every reply is a status word that store.go maps to
// an error of the taxonomy.

// luaHelpers is prepended to the scripts that write numbers.
const luaHelpers = `
local function fmt(x) return string.format('%d', x) end
`

// luaFit computes a node's hash from the facts in ARGV (register's
// layout, below) minus the allocations raws (allocation JSONs): fit(raws,
// status, epoch) returns the fields to HSET, or nil and the misfit reply
// when the allocations do not fit the facts. It writes nothing.
const luaFit = `
local function fit(raws, status, epoch)
  local n = tonumber(ARGV[5])
  local spec = cjson.decode(ARGV[2])
  local cpu, mem = tonumber(ARGV[3]), tonumber(ARGV[4])
  local milli, vram, sharers, max, mig = {}, {}, {}, {}, {}
  for i = 0, n - 1 do
    local b = 6 + 3 * i
    milli[i] = 1000
    vram[i] = tonumber(ARGV[b])
    sharers[i] = 0
    max[i] = tonumber(ARGV[b + 1])
    mig[i] = ARGV[b + 2]
  end
  local inst, prof, mb = {}, {}, 6 + 3 * n
  for k = 1, tonumber(ARGV[mb]) do
    local a = mb + 3 * k - 2
    inst['g' .. ARGV[a] .. '.mi.' .. ARGV[a + 1]] = ''
    prof['g' .. ARGV[a] .. '.mip.' .. ARGV[a + 1]] = ARGV[a + 2]
  end
  for _, raw in ipairs(raws) do
    local a = cjson.decode(raw)
    cpu = cpu - a.cpu_milli
    mem = mem - a.memory_mib
    for _, g in ipairs(a.gpus) do
      local i = g.index
      if i >= n then return nil, {'misfit', a.rental_id, 'gpu', fmt(i), fmt(n)} end
      if g.mig_profile and mig[i] ~= '1' then return nil, {'misfit', a.rental_id, 'mig', fmt(i), g.mig_profile} end
      if not g.mig_profile and mig[i] == '1' then return nil, {'misfit', a.rental_id, 'mig_mode', fmt(i), ''} end
      if g.mig_instance then
        local f = 'g' .. fmt(i) .. '.mi.' .. g.mig_instance
        if inst[f] ~= '' then return nil, {'misfit', a.rental_id, 'mig_instance', fmt(i), g.mig_instance} end
        inst[f] = a.rental_id
      end
      milli[i] = milli[i] - g.milli
      vram[i] = vram[i] - g.vram_mib
      sharers[i] = sharers[i] + 1
    end
  end
  if cpu < 0 then return nil, {'misfit', '', 'cpu_milli', '-1', fmt(cpu)} end
  if mem < 0 then return nil, {'misfit', '', 'memory_mib', '-1', fmt(mem)} end
  local f = {'spec', ARGV[2], 'status', status, 'epoch', epoch,
    'cpu_free', fmt(cpu), 'mem_free', fmt(mem), 'gpus', fmt(n)}
  for i = 0, n - 1 do
    if milli[i] < 0 then return nil, {'misfit', '', 'milli_gpu', fmt(i), fmt(milli[i])} end
    if vram[i] < 0 then return nil, {'misfit', '', 'vram_mib', fmt(i), fmt(vram[i])} end
    if sharers[i] > max[i] then return nil, {'misfit', '', 'sharer_slots', fmt(i), fmt(max[i] - sharers[i])} end
    local p = 'g' .. fmt(i) .. '.'
    table.insert(f, p .. 'milli'); table.insert(f, fmt(milli[i]))
    table.insert(f, p .. 'vram'); table.insert(f, fmt(vram[i]))
    table.insert(f, p .. 'sharers'); table.insert(f, fmt(sharers[i]))
    table.insert(f, p .. 'max'); table.insert(f, fmt(max[i]))
    table.insert(f, p .. 'migmode'); table.insert(f, mig[i])
    table.insert(f, 'model.' .. fmt(i)); table.insert(f, spec.gpus[i + 1].model)
  end
  for field, holder in pairs(inst) do table.insert(f, field); table.insert(f, holder) end
  for field, profile in pairs(prof) do table.insert(f, field); table.insert(f, profile) end
  -- GPU health marks (SetGPUHealth) outlive a registration.
  for i = 0, n - 1 do
    local h = redis.call('HGET', KEYS[1], 'g' .. fmt(i) .. '.health')
    if h then table.insert(f, 'g' .. fmt(i) .. '.health'); table.insert(f, h) end
  end
  return f
end
`

// registerScript creates a node or refreshes its static facts, keeping its
// epoch and allocations and recomputing what is free from them. It also
// creates the store's generation marker when there is none.
//
// KEYS: node, allocs, nodes, version, generation.
// ARGV: node id, spec JSON, cpu milli, memory MiB, GPU count n, then n
// groups of (VRAM MiB, max sharers, "1" if in MIG mode), then the MIG
// instance count m and m triples (GPU index, instance UUID, profile), and
// last a new generation id (written only if the store has none).
// A GPU's MIG mode is field g<i>.migmode ("1" or "0"; stores written
// before MIG mode was tracked have only g<i>.mig, MIG capability, and are
// read as not in MIG mode until the node registers again); its MIG
// instances are fields g<i>.mi.<uuid>: empty when free, else the holding
// rental id; g<i>.mip.<uuid> is the instance's profile; model.<i> is
// GPU i's model (what quotas count per model; not a g<i>. field, which
// readers before it would take for a number).
// Reply: {'ok', epoch, status, changed 0|1, generation} or
// {'misfit', rental id, resource, GPU index, value} when a live allocation
// does not fit the new facts.
var registerScript = redis.NewScript(luaHelpers + luaFit + `
redis.call('SET', KEYS[5], ARGV[#ARGV], 'NX')
local gen = redis.call('GET', KEYS[5])
local cur = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'spec', 'model.0')
local status, epoch = 'ready', '1'
if cur[1] then
  epoch = cur[2]
  if cur[1] ~= 'dead' then
    status = cur[1]
    -- (a node stored before GPU models were kept is written again)
    if cur[3] == ARGV[2] and cur[4] then return {'ok', epoch, status, 0, gen} end
  end
end
local f, misfit = fit(redis.call('HVALS', KEYS[2]), status, epoch)
if not f then return misfit end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(f))
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('INCR', KEYS[4])
return {'ok', epoch, status, 1, gen}
`)

// reserveScript commits one placement, all or nothing, and adds it to its
// tenant's usage (quota.go), checking the tenant's quota when given.
//
// KEYS: node, allocs, rentals, version, usage.
// ARGV: rental id, epoch, cpu milli, memory MiB, allocation JSON, share
// count n, then n groups of (GPU index, milli, VRAM MiB, MIG profile or an
// empty string, MIG instance UUID or an empty string), then the tenant,
// "1" when a quota follows (else "0"), the quota's total in milli-GPU,
// its model count k and k pairs (model, milli-GPU).
// The record written is the allocation JSON with the model of each share
// (gpu_models) put in front, when the node's GPUs have models.
// Reply: {'quota', model (empty for the total), limit, used, want} (milli-GPU),
// {'ok', version}, {'existing', allocation JSON}, {'not_found'},
// {'dead', epoch}, {'epoch', epoch}, {'not_ready', status},
// {'short', GPU index or '-1', resource, free, want}, {'no_gpu', index, count},
// {'not_mig', index}, {'mig_mode', index}, {'no_instance', index, uuid},
// {'wrong_profile', index, uuid, profile}, {'unhealthy', index, health},
// {'handing_over'} (the node still holds the
// rental's handed-over previous run).
var reserveScript = redis.NewScript(luaHelpers + `
local existing = redis.call('HGET', KEYS[3], ARGV[1])
if existing then return {'existing', existing} end
-- A previous run of the rental handed over (Store.HandOver) but still on
-- this node: one node holds one allocation per rental.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {'handing_over'} end
local n = tonumber(ARGV[6])
local fields = {'status', 'epoch', 'cpu_free', 'mem_free', 'gpus'}
for j = 0, n - 1 do
  local p = 'g' .. ARGV[7 + 5 * j] .. '.'
  local u = ARGV[11 + 5 * j]
  for _, f in ipairs({'milli', 'vram', 'sharers', 'max', 'migmode', 'health', 'mi.' .. u, 'mip.' .. u}) do fields[#fields + 1] = p .. f end
  fields[#fields + 1] = 'model.' .. ARGV[7 + 5 * j]
end
local v = redis.call('HMGET', KEYS[1], unpack(fields))
if not v[1] then return {'not_found'} end
if v[1] == 'dead' then return {'dead', v[2]} end
if tonumber(v[2]) ~= tonumber(ARGV[2]) then return {'epoch', v[2]} end
if v[1] ~= 'ready' then return {'not_ready', v[1]} end
-- The tenant's usage: what it holds, what this placement adds.
local q, tenant = 7 + 5 * n, ARGV[7 + 5 * n]
local want, wantm, models = 0, {}, {}
for j = 0, n - 1 do
  local milli, m = tonumber(ARGV[8 + 5 * j]), v[14 + 9 * j]
  want = want + milli
  models[j + 1] = m or ''
  if m then wantm[m] = (wantm[m] or 0) + milli end
end
if ARGV[q + 1] == '1' then
  local used = tonumber(redis.call('HGET', KEYS[5], tenant) or '0')
  if used + want > tonumber(ARGV[q + 2]) then return {'quota', '', ARGV[q + 2], fmt(used), fmt(want)} end
  for l = 1, tonumber(ARGV[q + 3]) do
    local m, max = ARGV[q + 2 + 2 * l], ARGV[q + 3 + 2 * l]
    if wantm[m] then
      local u = tonumber(redis.call('HGET', KEYS[5], tenant .. ' ' .. m) or '0')
      if u + wantm[m] > tonumber(max) then return {'quota', m, max, fmt(u), fmt(wantm[m])} end
    end
  end
end
local cpu, mem = tonumber(v[3]) - tonumber(ARGV[3]), tonumber(v[4]) - tonumber(ARGV[4])
if cpu < 0 then return {'short', '-1', 'cpu_milli', v[3], ARGV[3]} end
if mem < 0 then return {'short', '-1', 'memory_mib', v[4], ARGV[4]} end
local set = {'cpu_free', fmt(cpu), 'mem_free', fmt(mem)}
local count = tonumber(v[5])
for j = 0, n - 1 do
  local b, o = 7 + 5 * j, 6 + 9 * j
  local i = ARGV[b]
  if tonumber(i) >= count then return {'no_gpu', i, v[5]} end
  if v[o + 5] then return {'unhealthy', i, v[o + 5]} end
  if ARGV[b + 3] ~= '' then
    if v[o + 4] ~= '1' then return {'not_mig', i} end
    if not v[o + 6] then return {'no_instance', i, ARGV[b + 4]} end
    -- (a store registered before profiles were kept has none: not checked)
    if v[o + 7] and v[o + 7] ~= ARGV[b + 3] then return {'wrong_profile', i, ARGV[b + 4], v[o + 7]} end
    if v[o + 6] ~= '' then return {'short', i, 'mig_instance', '0', '1'} end
    set[#set + 1] = fields[o + 6]; set[#set + 1] = ARGV[1]
  elseif v[o + 4] == '1' then
    return {'mig_mode', i}
  end
  local milli, vram = tonumber(v[o]) - tonumber(ARGV[b + 1]), tonumber(v[o + 1]) - tonumber(ARGV[b + 2])
  local sharers, max = tonumber(v[o + 2]), tonumber(v[o + 3])
  if milli < 0 then return {'short', i, 'milli_gpu', v[o], ARGV[b + 1]} end
  if vram < 0 then return {'short', i, 'vram_mib', v[o + 1], ARGV[b + 2]} end
  if sharers >= max then return {'short', i, 'sharer_slots', fmt(max - sharers), '1'} end
  set[#set + 1] = fields[o]; set[#set + 1] = fmt(milli)
  set[#set + 1] = fields[o + 1]; set[#set + 1] = fmt(vram)
  set[#set + 1] = fields[o + 2]; set[#set + 1] = fmt(sharers + 1)
end
redis.call('HSET', KEYS[1], unpack(set))
local rec = ARGV[5]
if next(wantm) then rec = '{"gpu_models":' .. cjson.encode(models) .. ',' .. string.sub(rec, 2) end
redis.call('HSET', KEYS[2], ARGV[1], rec)
redis.call('HSET', KEYS[3], ARGV[1], rec)
redis.call('HINCRBY', KEYS[5], tenant, fmt(want))
for m, w in pairs(wantm) do redis.call('HINCRBY', KEYS[5], tenant .. ' ' .. m, fmt(w)) end
return {'ok', redis.call('INCR', KEYS[4])}
`)

// releaseScript gives one allocation's capacity back and forgets it; an
// index entry it removes is taken away from its tenant's usage.
//
// KEYS: node, allocs, rentals, version, usage.
// ARGV: rental id, the node id the caller found in the index, and
// optionally a mode: "handover" releases only a handed-over copy
// (handover.go); "live" only the allocation the index names (Release: the
// rental may have been handed over and reserved elsewhere since the caller
// read the index, and the copy left here is not the caller's to free); none
// releases whatever this node holds for the rental (ReleaseOn).
// Reply: {'ok', version}, {'none'} (nothing to release), {'moved', node id}
// (the rental now lives on another node: look it up again).
var releaseScript = redis.NewScript(luaHelpers + luaUsage + `
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if ARGV[3] == 'handover' and not (rec and string.sub(rec, 1, 17) == '{"handover":true,') then return {'none'} end
if ARGV[3] == 'live' and rec then
  local idx = redis.call('HGET', KEYS[3], ARGV[1])
  if not idx then return {'none'} end
  if idx ~= rec then return {'moved', cjson.decode(idx).node_id} end
end
if not rec then
  local idx = redis.call('HGET', KEYS[3], ARGV[1])
  if not idx then return {'none'} end
  local node_id = cjson.decode(idx).node_id
  if node_id ~= ARGV[2] then return {'moved', node_id} end
  -- An index entry without its node record (never written so by this
  -- package): drop it, there is no capacity to give back.
  redis.call('HDEL', KEYS[3], ARGV[1])
  usage(KEYS[5], cjson.decode(idx), -1)
  return {'ok', redis.call('INCR', KEYS[4])}
end
local a = cjson.decode(rec)
local fields = {'cpu_free', 'mem_free'}
for _, g in ipairs(a.gpus) do
  local p = 'g' .. fmt(g.index) .. '.'
  fields[#fields + 1] = p .. 'milli'
  fields[#fields + 1] = p .. 'vram'
  fields[#fields + 1] = p .. 'sharers'
  fields[#fields + 1] = p .. 'mi.' .. (g.mig_instance or '')
end
local v = redis.call('HMGET', KEYS[1], unpack(fields))
if v[1] then
  local set = {'cpu_free', fmt(tonumber(v[1]) + a.cpu_milli), 'mem_free', fmt(tonumber(v[2]) + a.memory_mib)}
  for k, g in ipairs(a.gpus) do
    local o = 4 * k - 1
    set[#set + 1] = fields[o]; set[#set + 1] = fmt(tonumber(v[o]) + g.milli)
    set[#set + 1] = fields[o + 1]; set[#set + 1] = fmt(tonumber(v[o + 1]) + g.vram_mib)
    set[#set + 1] = fields[o + 2]; set[#set + 1] = fmt(tonumber(v[o + 2]) - 1)
    if g.mig_instance and v[o + 3] == ARGV[1] then set[#set + 1] = fields[o + 3]; set[#set + 1] = '' end
  end
  redis.call('HSET', KEYS[1], unpack(set))
end
redis.call('HDEL', KEYS[2], ARGV[1])
-- The index entry is this very record unless the allocation was handed
-- over (Store.HandOver): then the index is gone or names the next run.
if redis.call('HGET', KEYS[3], ARGV[1]) == rec then
  redis.call('HDEL', KEYS[3], ARGV[1])
  usage(KEYS[5], a, -1)
end
return {'ok', redis.call('INCR', KEYS[4])}
`)

// fenceScript moves a node's epoch on and marks it dead, if the caller saw
// the current epoch.
//
// KEYS: node, allocs, version. ARGV: expected epoch.
// Reply: {'ok', new epoch, {allocation JSON...}}, {'not_found'},
// {'conflict', current epoch}.
var fenceScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'epoch')
if not e then return {'not_found'} end
if tonumber(e) ~= tonumber(ARGV[1]) then return {'conflict', e} end
local ne = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'status', 'dead')
redis.call('INCR', KEYS[3])
return {'ok', ne, redis.call('HVALS', KEYS[2])}
`)

// renewScript checks that a node still holds an allocation under its epoch.
//
// KEYS: node, allocs. ARGV: rental id, the agent's epoch.
// Reply: {'ok'}, {'no_node'}, {'dead', epoch}, {'epoch', node epoch},
// {'no_alloc'}, {'stale', allocation epoch, node epoch}.
var renewScript = redis.NewScript(`
local node = redis.call('HMGET', KEYS[1], 'status', 'epoch')
if not node[1] then return {'no_node'} end
if node[1] == 'dead' then return {'dead', node[2]} end
if tonumber(node[2]) ~= tonumber(ARGV[2]) then return {'epoch', node[2]} end
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if not rec then return {'no_alloc'} end
local ae = cjson.decode(rec).epoch
if ae ~= tonumber(node[2]) then return {'stale', string.format('%d', ae), node[2]} end
return {'ok'}
`)

// setStatusScript switches a live node between ready and draining.
//
// KEYS: node, version. ARGV: status, expected epoch.
// Reply: {'ok', changed 0|1}, {'not_found'}, {'dead', epoch},
// {'conflict', epoch}.
var setStatusScript = redis.NewScript(`
local node = redis.call('HMGET', KEYS[1], 'status', 'epoch')
if not node[1] then return {'not_found'} end
if node[1] == 'dead' then return {'dead', node[2]} end
if tonumber(node[2]) ~= tonumber(ARGV[2]) then return {'conflict', node[2]} end
if node[1] == ARGV[1] then return {'ok', 0} end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
redis.call('INCR', KEYS[2])
return {'ok', 1}
`)

// removeScript forgets a node that holds no allocations.
//
// KEYS: node, allocs, nodes, version. ARGV: node id.
// Reply: {'ok'}, {'not_found'}, {'busy', allocation count}.
var removeScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_found'} end
local n = redis.call('HLEN', KEYS[2])
if n > 0 then return {'busy', n} end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('INCR', KEYS[4])
return {'ok'}
`)
