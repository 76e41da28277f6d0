"""Lua scripts over a Batch API batch's keys (`shared/batch_api_store.py`): progress is derived
from the item job hashes without a per-item poll from the client, and a batch is handed to
exactly one finalizer, however many producers look at it at once.

A batch's items live in many partitions, hence many slots of a cluster, and its hash in one
more, so no script sees them all (shared/keys.py): COUNT reads one partition's item job hashes
in that partition's slot and writes nothing; ADVANCE applies what it counted to the batch hash,
in the batch's slot. Each partition's item list is written before the batch starts and only
appended to after (FED, HELD_END: the items its bulk lane had no room for then), and
the batch hash holds a cursor into it (`at:<index>`, how many of its items are counted). ADVANCE
applies a count only if the cursor is still where the count started, then moves the cursor: a
count is applied exactly once, whether two producers count the same items at once (the second
finds the cursor moved and is dropped) or a producer dies between the two scripts (nothing was
applied; the next look counts those items again)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from shared.job_scripts import LUA_HERE
from shared.job_states import TERMINAL, JobStatus
from shared.keys import LUA_JOB_KEY


class BatchStatus(StrEnum):
    """A batch hash's `status`, defined beside the scripts that read and write it (the store
    imports them): COMMIT's ended statuses are rendered from `terminal`'s, where its Lua spelled
    them out again and a status added to one alone was kept, or written over, wrongly."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in BATCH_ENDED


# The statuses a batch ends in, for good.
BATCH_ENDED = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.CANCELLED, BatchStatus.EXPIRED}
)

# The states an item ends in, in the enum's order: the order of counts in both scripts' replies.
ITEM_STATES = tuple(status.value for status in JobStatus if status in TERMINAL)


def _lua_table(value: str, states: Iterable[str] = ITEM_STATES) -> str:
    return "{" + ", ".join(f"{state}={value}" for state in states) + "}"


def _lua_list(table: str) -> str:
    return ", ".join(f"{table}.{state}" for state in ITEM_STATES)


_STATES = "{" + ", ".join(f"'{state}'" for state in ITEM_STATES) + "}"

# KEYS[1]=one partition's item list; ARGV: job-key prefix, cursor, pop budget, window.
# Terminal states never change, so the run of terminal items from the cursor on is counted for
# good (`counts`), at most `budget` items per call (`more` says to call again from `at`). Items
# finish a little out of order (a micro-batch, several workers): a `window` of items behind the
# first unfinished one is looked at and counted for this answer only (`seen`). A job hash gone
# (expired) counts as `expired`. One that a migration of the partition's slot moved ahead of the
# list reads as unfinished, so the count stops there until the slot has moved: the script
# failed (a 503 for the batch) where a skip or a gone hash would count it wrongly, for good.
# Returns {at, more, counts..., seen...}.
COUNT = (
    LUA_JOB_KEY
    + LUA_HERE
    + f"local TERMINAL = {_lua_table('true')}\n"
    + f"local counts, seen = {_lua_table('0')}, {_lua_table('0')}\n"
    + """
local prefix, at = ARGV[1], tonumber(ARGV[2])
local budget, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local function status(jid)
  local st, served = here('HGET', jobkey(prefix, jid), 'status')
  if not served then return 'moving' end  -- not terminal: counted once it can be read
  return st or 'expired'
end
local blocked = false
while not blocked and budget > 0 do
  local ids = redis.call('LRANGE', KEYS[1], at, at + math.min(budget, 512) - 1)
  if #ids == 0 then break end
  for _, jid in ipairs(ids) do
    local st = status(jid)
    if not TERMINAL[st] then blocked = true break end
    counts[st] = counts[st] + 1
    at = at + 1
    budget = budget - 1
  end
end
local more = 0
if not blocked and budget == 0 and redis.call('LLEN', KEYS[1]) > at then more = 1 end
if blocked and window > 0 then
  for _, jid in ipairs(redis.call('LRANGE', KEYS[1], at + 1, at + window)) do
    local st = status(jid)
    if TERMINAL[st] then seen[st] = seen[st] + 1 end
  end
end
"""
    + f"return {{at, more, {_lua_list('counts')}, {_lua_list('seen')}}}\n"
)

# KEYS[1]=batch hash; ARGV: now_ms, stale_ms, the call's token, then per partition counted:
# index, cursor the count started from, cursor it reached, counts..., seen... (COUNT's, in
# ITEM_STATES order).
# A count of some items whose start is still the partition's cursor (and only while the batch
# runs) moves the cursor, adds to `n_<status>` and takes `open` down. Its `seen` (items past
# where it stopped) joins this answer if the cursor is where it stopped: moved by it, or by a
# producer that counted the same items at the same time; otherwise it is dropped, never counted
# twice. When `open` is 0, the batch moves to `finalizing` and the caller that saw it move (or
# that found a finalizer silent for `stale_ms`) is told to finalize; its token, kept as
# `finalizer`, tells that caller so again when the client reruns the call (its reply lost).
# A batch not asked to end early that reaches `open` 0 past its `expires_at` with an item the
# window stopped (workers expire the items they read past it themselves), or a result that came
# past it, ends `expired`, not `completed`: decided by its finalizer, which reads every item's
# deadline and end (`BatchApiStore.finish`); an item `expired` by its line's own, earlier
# deadline is no sign of the window's.
# Returns false when the batch is gone, else {finalize, hash fields..., seen...}.
ADVANCE = (
    f"local STATES = {_STATES}\n"
    + f"local seen = {_lua_table('0')}\n"
    + """
local now, stale, token = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return false end
local n = #STATES
for i = 4, #ARGV, 3 + 2 * n do
  local cursor = 'at:' .. ARGV[i]
  local from, to = ARGV[i + 1], ARGV[i + 2]
  local at = redis.call('HGET', KEYS[1], cursor) or '0'
  if cur == 'in_progress' and at == from and from ~= to then
    redis.call('HSET', KEYS[1], cursor, to)
    redis.call('HINCRBY', KEYS[1], 'open', tonumber(from) - tonumber(to))
    for s, state in ipairs(STATES) do
      local counted = tonumber(ARGV[i + 2 + s])
      if counted > 0 then redis.call('HINCRBY', KEYS[1], 'n_' .. state, counted) end
    end
    at = to
  end
  if at == to then
    for s, state in ipairs(STATES) do
      seen[state] = seen[state] + tonumber(ARGV[i + 2 + n + s])
    end
  end
end
local finalize = 0
if tonumber(redis.call('HGET', KEYS[1], 'open') or '0') == 0 then
  local since = tonumber(redis.call('HGET', KEYS[1], 'finalizing_at') or '0')
  if cur == 'in_progress' or (cur == 'finalizing' and since < now - stale) then
    redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizing_at', now, 'finalizer', token)
    finalize = 1
  elseif cur == 'finalizing' and redis.call('HGET', KEYS[1], 'finalizer') == token then
    finalize = 1
  end
end
"""
    + f"return {{finalize, redis.call('HGETALL', KEYS[1]), {_lua_list('seen')}}}\n"
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

# KEYS[1]=batch hash, then the batch's lists its files are read from; ARGV: ttl_s, when the
# files expire (Unix s), then the fields of its ending (`status` first). A finalizer's commit:
# its ending written, the hash given `ttl_s` from now and the lists the files' expiry, only while
# the hash exists and has not ended. One that expired since the finalizer counted it stays gone:
# written, it came back a batch of a `status` alone, with no tenant, counts or times. One that
# ended since keeps its end: a finalizer that went silent past STALE_MS, then woke, wrote its
# own over its successor's (`completed` over the `expired` a client had read, counts and all).
# Returns the status in force, false when the batch is gone; {status, its `<status>_at`} for an
# end in force ended at another time than this one's (ARGV[6], its `_at`), whose items the
# caller gives that end's expiry: read here, it cost the caller an HGET after every commit.
COMMIT = (
    f"local ENDED = {_lua_table('true', sorted(BATCH_ENDED))}\n"
    + """
local cur = redis.call('HGET', KEYS[1], 'status')
if not cur then return false end
if ENDED[cur] then
  local at = redis.call('HGET', KEYS[1], cur .. '_at')
  if at and at ~= ARGV[6] then return {cur, at} end
  return cur
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[1])
for i = 2, #KEYS do redis.call('EXPIREAT', KEYS[i], ARGV[2]) end
return ARGV[4]
"""
)

# KEYS[1]=batch hash; ARGV: field, value. HSETNX, only while the hash exists: on a hash that
# expired after its last read, HSETNX made a key of that field alone, with no TTL.
SET_UNLESS_SET = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
"""

# KEYS[1]=one of a batch's lists (its items in line order, one partition's items, its refused
# lines); ARGV: ttl_s, then the list's values. Written afresh, so a rerun (a reply lost) lists
# nothing twice, and given its TTL in the same step: as a pipeline's DEL, RPUSH and EXPIRE, a
# connection torn after the RPUSH reached the server left a list with no TTL, kept for ever.
REPLACE_LIST = """
redis.call('DEL', KEYS[1])
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return redis.call('EXPIRE', KEYS[1], ARGV[1])
"""

# KEYS[1]=a batch's held list in one partition (its items the bulk lane had no room for, each
# `<record JSON>\n<entry JSON>`), KEYS[2]=the batch's item list in that partition; ARGV: the
# held list's first entry as the feeder read it, then the ids of the entries from there on that
# the lane took (ENQUEUE's, a call before). They leave the held list for the item list in one
# step, once: a second feeder of the same entries (two producers sweep) finds the head moved and
# records nothing, and one that died after its ENQUEUE is followed by a feeder whose ENQUEUE of
# the same ids finds their hashes and enqueues nothing twice. The item list gets the held
# list's TTL (a partition with no item enqueued at create has none until now).
# Returns 1 when recorded, 0 when another feeder had.
FED = """
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('LTRIM', KEYS[1], #ARGV - 1, -1)
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""

# KEYS[1]=a batch's held list in one partition, KEYS[2]=its item list there; ARGV: job-key
# prefix, how many entries, the items' ttl_s, then the fields of their end (status, error,
# finished). A cancel's or an expiry's: up to that many held entries leave the held list for the
# item list, each ended as a job record (its record's fields and the end's) unless its hash
# exists (a feeder's ENQUEUE came first: the caller settles it as any enqueued item). A feeder's
# ENQUEUE after this finds the hash and enqueues nothing, so a held item of an ended batch never
# runs. Returns how many entries the held list still has.
HELD_END = (
    LUA_JOB_KEY
    + """
local prefix, ttl = ARGV[1], ARGV[3]
local list_ttl = redis.call('PTTL', KEYS[1])
local entries = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
if #entries == 0 then return 0 end
local ids = {}
for _, raw in ipairs(entries) do
  local record = cjson.decode(string.sub(raw, 1, string.find(raw, '\\n', 1, true) - 1))
  local jk = jobkey(prefix, record.id)
  if redis.call('EXISTS', jk) == 0 then
    redis.call('HSET', jk, unpack(record.fields))
    redis.call('HSET', jk, unpack(record.record))
    redis.call('HSET', jk, unpack(ARGV, 4))
    redis.call('EXPIRE', jk, ttl)
  end
  table.insert(ids, record.id)
end
redis.call('LTRIM', KEYS[1], #entries, -1)
for i = 1, #ids, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ids, i, math.min(i + 999, #ids)))
end
if list_ttl > 0 then redis.call('PEXPIRE', KEYS[2], list_ttl) end
return redis.call('LLEN', KEYS[1])
"""
)
