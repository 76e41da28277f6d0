"""Lua scripts that change job state atomically with the stream: a result is visible if and only
if its entry is acknowledged (docs/architecture.md), which needs one server-side step, not
several calls."""

from __future__ import annotations

from shared.job_states import lua_transition_table

_PRELUDE = (
    lua_transition_table()
    + """
local function can(cur, to)
  local t = cur and ALLOWED[cur]  -- a missing hash or field reads as false
  return t ~= nil and t ~= false and t[to] == 1
end

-- Mark one job running (queued|running -> running) with its start, worker and attempt number.
-- Returns its status after.
local function claim(jk, now, worker, attempts)
  local cur = redis.call('HGET', jk, 'status')
  if not cur then return 'missing' end
  if not can(cur, 'running') then return cur end
  redis.call('HSET', jk, 'status', 'running', 'started', now, 'worker', worker,
             'attempts', attempts)
  return 'running'
end

-- A finished job gives back its API key's in-flight slot (the hash names the slot's key).
local function free_slot(jk, jid)
  local slot = redis.call('HGET', jk, 'inflight')
  if slot then redis.call('ZREM', slot, jid) end
end

local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
"""
)

# KEYS: streams in order of preference (lanes); ARGV: group, consumer, count, job-key prefix,
# now_ms, mark ('1': mark the jobs running, as a generate loop wants; '': only read their status).
# Non-blocking XREADGROUP of the first stream that has new entries, plus each job's status, in one
# round trip; returns {index of that stream (0: none), {entry_id, fields, status} triples}.
TAKE = (
    _PRELUDE
    + """
for k = 1, #KEYS do
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                         'STREAMS', KEYS[k], '>')
  if res then
    local out = {}
    for _, e in ipairs(res[1][2]) do
      local jid = field(e[2], 'id')
      local status = 'missing'
      if jid and ARGV[6] == '1' then
        status = claim(ARGV[4] .. jid, ARGV[5], ARGV[2], 1)
      elseif jid then
        status = redis.call('HGET', ARGV[4] .. jid, 'status') or 'missing'
      end
      table.insert(out, {e[1], e[2], status})
    end
    return {k, out}
  end
end
return {0, {}}
"""
)

# ARGV: job-key prefix, worker, then per job: job id, started_ms, attempt → statuses after.
# Marks jobs a plain XREADGROUP delivered as running, when their run is long enough to be seen.
MARK_RUNNING = (
    _PRELUDE
    + """
local out = {}
for i = 3, #ARGV, 3 do
  table.insert(out, claim(ARGV[1] .. ARGV[i], ARGV[i + 1], ARGV[2], ARGV[i + 2]))
end
return out
"""
)

# KEYS[1]=job key, KEYS[2]=stream; ARGV: max_length (0: none), ttl_s, n hash pairs, hash
# field/value pairs..., entry field/value pairs... Admission control and enqueue in one atomic
# step: a full partition refuses (returns {0, length}); nothing accepted is ever trimmed.
ENQUEUE = """
local max_length = tonumber(ARGV[1])
local length = redis.call('XLEN', KEYS[2])
if max_length > 0 and length >= max_length then return {0, length} end
local n = tonumber(ARGV[3])
local hash = {}
for i = 4, 3 + n * 2 do table.insert(hash, ARGV[i]) end
local entry = {}
for i = 4 + n * 2, #ARGV do table.insert(entry, ARGV[i]) end
redis.call('HSET', KEYS[1], unpack(hash))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[2], '*', unpack(entry))
return {1, length + 1}
"""

# KEYS[1]=stream, KEYS[2]=dead-letter stream; ARGV: group, consumer, min_idle_ms, count,
# job-key prefix, now_ms, max_deliveries, ttl_s. Takes over entries idle past the visibility
# timeout (a dead or stuck consumer's); past max_deliveries they move to the DLQ and their job
# fails with the reason (row status 'dead'; 'dead-ended' when the job had already ended),
# otherwise they are claimed for running again. Rows: {entry_id, fields, status, deliveries}.
RECLAIM = (
    _PRELUDE
    + """
local res = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
for _, e in ipairs(res[2]) do
  local eid, fields = e[1], e[2]
  local info = redis.call('XPENDING', KEYS[1], ARGV[1], eid, eid, 1)
  local deliveries = info[1] and tonumber(info[1][4]) or 1
  local jid = field(fields, 'id')
  if deliveries > tonumber(ARGV[7]) then
    local reason = 'dead-lettered after ' .. deliveries .. ' deliveries without finishing'
      .. ' (max_deliveries ' .. ARGV[7] .. ')'
    local dead = {'entry', eid, 'reason', reason, 'deliveries', deliveries}
    for i = 1, #fields do table.insert(dead, fields[i]) end
    redis.call('XADD', KEYS[2], '*', unpack(dead))
    local jk = jid and (ARGV[5] .. jid)
    local fate = 'dead-ended'
    if jk and can(redis.call('HGET', jk, 'status'), 'failed') then
      fate = 'dead'
      local err = cjson.encode({type = 'DeadLettered', message = reason})
      redis.call('HSET', jk, 'status', 'failed', 'error', err, 'finished', ARGV[6])
      redis.call('EXPIRE', jk, ARGV[8])
      free_slot(jk, jid)
      local reply = field(fields, 'reply')
      if reply and reply ~= '' then
        local m = redis.call('HMGET', jk, 'model', 'variant')
        redis.call('PUBLISH', reply, cjson.encode({id = jid, status = 'failed', model = m[1],
          variant = m[2], error = {type = 'DeadLettered', message = reason}}))
      end
    end
    redis.call('XACK', KEYS[1], ARGV[1], eid)
    redis.call('XDEL', KEYS[1], eid)
    table.insert(out, {eid, fields, fate, deliveries})
  else
    local status = jid and claim(ARGV[5] .. jid, ARGV[6], ARGV[2], deliveries) or 'missing'
    table.insert(out, {eid, fields, status, deliveries})
  end
end
return out
"""
)

# KEYS[1]=stream, KEYS[2]=this second's drained counter; ARGV: group, ttl_s, job-key prefix,
# worker, then per job a record:
#   entry_id, job_id, reply_channel, view, status, nfields, field, value, ...
# status '' means only acknowledge (job already terminal, cancelled or gone); a job still
# `queued` ran unmarked (see stream_reader.py) and moves as if from `running`.
# Per written job three commands (HMGET, HSET, EXPIRE); per micro-batch one PUBLISH per reply
# channel (a JSON array of the views written for it), one ZREM per in-flight set, XACK, XDEL.
FINISH = (
    _PRELUDE
    + """
local i = 5
local ids, written = {}, {}
local replies, channels, slots, slot_keys = {}, {}, {}, {}
while i <= #ARGV do
  local eid, jid, reply, view, status = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  local n = tonumber(ARGV[i+5])
  table.insert(ids, eid)
  if status ~= '' then
    local jk = ARGV[3] .. jid
    local cur = redis.call('HMGET', jk, 'status', 'inflight', 'writes')
    -- a job handed over by a plain XREADGROUP ran without its hash saying so: through running
    local from = (cur[1] == 'queued' and can('queued', 'running')) and 'running' or cur[1]
    if can(from, status) then
      local args = {'status', status, 'worker', ARGV[4], 'writes', (tonumber(cur[3]) or 0) + 1}
      for j = 1, n * 2 do table.insert(args, ARGV[i + 5 + j]) end
      redis.call('HSET', jk, unpack(args))
      redis.call('EXPIRE', jk, ARGV[2])
      if reply ~= '' then
        if not replies[reply] then replies[reply] = {}; table.insert(channels, reply) end
        table.insert(replies[reply], view)
      end
      local slot = cur[2]
      if slot then
        if not slots[slot] then slots[slot] = {}; table.insert(slot_keys, slot) end
        table.insert(slots[slot], jid)
      end
      table.insert(written, jid)
    end
  end
  i = i + 6 + n * 2
end
for _, reply in ipairs(channels) do
  redis.call('PUBLISH', reply, '[' .. table.concat(replies[reply], ',') .. ']')
end
for _, slot in ipairs(slot_keys) do redis.call('ZREM', slot, unpack(slots[slot])) end
if #ids > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  if redis.call('INCRBY', KEYS[2], #ids) == #ids then redis.call('EXPIRE', KEYS[2], 120) end
end
return written
"""
)

# KEYS[1]=job key; ARGV: target status, reply channel, message, ttl_s, job id, field, value, ...
# Returns {ok(0|1), status before}. A terminal target frees the job's in-flight slot.
TRANSITION = (
    _PRELUDE
    + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not can(cur, ARGV[1]) then return {0, cur or false} end
local args = {'status', ARGV[1]}
for j = 6, #ARGV do table.insert(args, ARGV[j]) end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
if not ALLOWED[ARGV[1]] then free_slot(KEYS[1], ARGV[5]) end
return {1, cur}
"""
)
