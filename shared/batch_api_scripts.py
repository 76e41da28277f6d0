"""Lua scripts over a Batch API batch's keys (`shared/batch_api_store.py`): progress is derived
from the item job hashes without a per-item poll from the client, and a batch is handed to
exactly one finalizer, however many producers look at it at once."""

from __future__ import annotations

from shared.job_states import TERMINAL, JobStatus

# The states an item ends in, in the enum's order: the order of `seen` in REFRESH's reply.
ITEM_STATES = tuple(status.value for status in JobStatus if status in TERMINAL)


def _lua_table(value: str) -> str:
    return "{" + ", ".join(f"{state}={value}" for state in ITEM_STATES) + "}"


_PRELUDE = f"local TERMINAL = {_lua_table('true')}\nlocal seen = {_lua_table('0')}\n"
_SEEN = "{" + ", ".join(f"seen.{state}" for state in ITEM_STATES) + "}"


# KEYS[1]=batch hash; ARGV: job-key prefix, window, pop budget, now_ms, stale_ms.
# Each open list holds one partition's items not yet seen terminal, in stream order. Terminal
# states never change, so the terminal head of every list is popped and counted for good
# (`n_<status>`), at most `budget` items per call (`more` says to call again). Items finish a
# little out of order (a micro-batch, several workers): a `window` of items behind each head is
# looked at and counted for this answer only. When no item is open, the batch moves to
# `finalizing` and the caller that saw it move (or that found a finalizer silent for
# `stale_ms`) is told to finalize. Returns {open, more, finalize, hash fields..., seen...}.
REFRESH = (
    _PRELUDE
    + """
local prefix, window, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, stale = tonumber(ARGV[4]), tonumber(ARGV[5])
local lists = redis.call('HGET', KEYS[1], 'open_lists')
if not lists then return false end
local function status(jid)
  return redis.call('HGET', prefix .. jid, 'status') or 'expired'
end
local open, more = 0, 0
for _, list in ipairs(cjson.decode(lists)) do
  local blocked = false
  while not blocked and budget > 0 do
    local ids = redis.call('LRANGE', list, 0, math.min(budget, 512) - 1)
    if #ids == 0 then break end
    local n = 0
    for _, jid in ipairs(ids) do
      local st = status(jid)
      if not TERMINAL[st] then blocked = true break end
      redis.call('HINCRBY', KEYS[1], 'n_' .. st, 1)
      n = n + 1
    end
    if n > 0 then redis.call('LTRIM', list, n, -1) end
    budget = budget - n
  end
  local left = redis.call('LLEN', list)
  if not blocked and left > 0 then more = 1 end
  if window > 0 and left > 1 then
    for _, jid in ipairs(redis.call('LRANGE', list, 1, window)) do
      local st = status(jid)
      if TERMINAL[st] then seen[st] = seen[st] + 1 end
    end
  end
  open = open + left
end
local finalize = 0
if open == 0 then
  local cur = redis.call('HGET', KEYS[1], 'status')
  local since = tonumber(redis.call('HGET', KEYS[1], 'finalizing_at') or '0')
  if cur == 'in_progress' or (cur == 'finalizing' and since < now - stale) then
    redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizing_at', now)
    finalize = 1
  end
end
return {open, more, finalize, redis.call('HGETALL', KEYS[1]), """
    + _SEEN
    + "}\n"
)

# KEYS[1]=batch hash; ARGV: ending (cancelled|expired), now_ms. Records, once and only while
# the batch runs, that it is to end early; a second request finds the first one's ending.
# Returns {status, ending in force or false}.
REQUEST_END = """
local cur = redis.call('HGET', KEYS[1], 'status')
if cur ~= 'in_progress' then return {cur or false, false} end
local ending = redis.call('HGET', KEYS[1], 'ending')
if ending then return {cur, ending} end
redis.call('HSET', KEYS[1], 'ending', ARGV[1], 'ending_at', ARGV[2])
return {cur, ARGV[1]}
"""
