"""Lua scripts that change job state atomically with the stream: a result is visible if and only
if its entry is acknowledged (docs/architecture.md), which needs one server-side step, not
several calls."""

from __future__ import annotations

from shared.api_keys import MIN_WEIGHT
from shared.codec import MOVED_FIELD
from shared.job_states import lua_transition_table
from shared.keys import (
    ADDED_SUFFIX,
    DRAINED_SUFFIX,
    FAIR_ENDED_SUFFIX,
    FAIR_PARKED_SUFFIX,
    FAIR_RING_SUFFIX,
    FAIR_SINCE_SUFFIX,
    FAIR_SUFFIX,
    GROUP,
    HELD_SUFFIX,
    LUA_JOB_KEY,
    RECENT_KEPT,
    RECENT_SLACK,
    RECENT_SUFFIX,
    REFUSED_SUFFIX,
    REFUSED_TTL_S,
    UNCOUNTED_SUFFIX,
    WEBHOOKS_OWED_SUFFIX,
    WITHDRAWN_SUFFIX,
)

# Held entries of ended jobs one refill drops at most (~3 us each): a fair lane's lists of
# cancelled jobs are dropped over as many refills as it takes, none holding the server long.
REFILL_MAX_DROPS = 256

# ENQUEUE's max_ahead for a job that any number of entries may wait ahead of and whose caller
# reads no position from the reply (submit-and-wait, a batch's items): a plain lane's call of
# only such jobs reads no pending count (XPENDING), a command fewer per call (benchmark part D).
UNPLACED = -2

# Entries of a lane stream no consumer has been handed yet: the one definition, which the
# scripts here and shared/drain_rate.py's WAITING share.
LUA_UNDELIVERED = """
-- Entries of a lane stream no consumer has been handed yet (acknowledged ones are deleted).
local function undelivered(stream, group)
  local ok, pel = pcall(redis.call, 'XPENDING', stream, group)
  return redis.call('XLEN', stream) - (ok and pel[1] or 0)
end
"""

# A field's value in a flat HGETALL-style list (nil when absent): one Lua helper for every script
# that reads a job's or an entry's fields.
LUA_FIELD = """
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return nil
end
"""
# A command on a key the script does not declare, and whether this master served it: one Lua
# helper for every script that touches such keys (job hashes found from entries or item lists).
LUA_HERE = """
-- A command on a key the script does not declare, and whether this master served it: while the
-- key's slot migrates, one that is not here (moved ahead of the keys the script declares, or not
-- made yet, which only the importing master may do) is refused, and the script goes on without
-- it rather than failing part-way (docs/redis-cluster.md, "Resharding"). Other errors are raised.
-- `here_all` runs a function of several such commands alike: stopped at the first not here.
local function here_all(fn, ...)
  local ok, reply = pcall(fn, ...)
  if ok then return reply, true end
  local err = type(reply) == 'table' and reply.err or tostring(reply)
  if not string.find(err, 'non local key', 1, true) then error(reply) end
  return nil, false
end

local function here(...)
  return here_all(redis.call, ...)
end
"""
_PRELUDE = (
    lua_transition_table()
    + LUA_JOB_KEY
    + LUA_HERE
    + """
local function can(cur, to)
  local t = cur and ALLOWED[cur]  -- a missing hash or field reads as false
  return t ~= nil and t ~= false and t[to] == 1
end

-- Whether the job of a held entry (its hash's status and `held`) still waits for its turn: not
-- ended, and not moved in already by another entry of the same job (a replay held again once the
-- first replay's held hash expired: both entries moved in, the job ran twice).
local function waits(job)
  return job[2] == '1' and can(job[1], 'running')
end

-- One attempt of the job's history (`attempt_history`, a JSON list), as JSON: who ran it (the
-- consumer `{host}-{pid}`, split), from when to when (ms), how it ended and the error (a JSON
-- string or a table), if any.
local function attempt(consumer, started, ended, outcome, err)
  local host, pid = string.match(consumer or '', '^(.+)-(%d+)$')
  if type(err) == 'string' then err = cjson.decode(err) end
  return cjson.encode({consumer = consumer or nil, host = host, pid = tonumber(pid),
    started = tonumber(started), ended = tonumber(ended), outcome = outcome, error = err})
end

-- `history` (a JSON list, or nothing yet) with `item` appended, without decoding it.
local function appended(history, item)
  if not history then return '[' .. item .. ']' end
  return string.sub(history, 1, -2) .. ',' .. item .. ']'
end

-- The history of job `jk` after the attempt of `owner` (an XPENDING row: entry, consumer, idle
-- ms) ended `outcome` at `now` without a result: it started when that consumer marked the job
-- running, or else when the entry was last delivered to it (now - idle).
local function abandoned(jk, owner, now, outcome, err)
  local h = redis.call('HMGET', jk, 'worker', 'started', 'attempt_history')
  local started = tonumber(now) - tonumber(owner[3])
  if h[1] == owner[2] and h[2] then started = h[2] end
  return appended(h[3], attempt(owner[2], started, now, outcome, err))
end

-- Mark one job running (queued|running -> running) with its start, worker and attempt number;
-- `owner` (an XPENDING row) when the entry is taken over from a consumer that abandoned it: its
-- attempt goes on record as crashed. Returns the job's status after. A mark from an earlier
-- delivery than the one another worker runs (a worker cut off from Redis past the visibility
-- timeout, whose mark lands after RECLAIM took the entry over) changes nothing: the job stays
-- its new owner's, whose result FINISH keeps. A hash a slot's migration has moved already is
-- left unmarked and reads as `queued`: the entry is run as a blocking read's is, FINISH's own
-- state check deciding its result (an error here would leave it pending, run by nobody, for
-- a visibility timeout).
local function claim(jk, now, worker, attempts, owner)
  local job, served = here('HMGET', jk, 'status', 'attempts', 'worker')
  if not served then return 'queued' end
  local cur = job[1]
  if not cur then return 'missing' end
  if not can(cur, 'running') then return cur end
  if cur == 'running' and job[3] ~= worker and (tonumber(job[2]) or 0) > tonumber(attempts) then
    return cur
  end
  local args = {'status', 'running', 'started', now, 'worker', worker, 'attempts', attempts}
  if owner then
    -- idle: since its last sign of life (a read, a touch, a claim), not since the attempt began
    local err = {type = 'WorkerLost', message = 'no sign of life from ' .. owner[2] .. ' for '
      .. owner[3] .. ' ms; taken over by ' .. worker}
    table.insert(args, 'attempt_history')
    table.insert(args, abandoned(jk, owner, now, 'crashed', err))
  end
  redis.call('HSET', jk, unpack(args))
  return 'running'
end

"""
    + LUA_FIELD
    + f"""
local ADDED, FAIR, RECENT = '{ADDED_SUFFIX}', '{FAIR_SUFFIX}', '{RECENT_SUFFIX}'
local RECENT_KEPT, RECENT_SLACK = {RECENT_KEPT}, {RECENT_SLACK}
local FAIR_RING, HELD, MOVED = '{FAIR_RING_SUFFIX}', '{HELD_SUFFIX}', '{MOVED_FIELD}'
local PARKED, ENDED = '{FAIR_PARKED_SUFFIX}', '{FAIR_ENDED_SUFFIX}'
local WSUM = 'wsum'  -- the fair hash's sum of the ring's tenants' weights
local SINCE = '{FAIR_SINCE_SUFFIX}'
local REFUSED, REFUSED_TTL = '{REFUSED_SUFFIX}', {REFUSED_TTL_S}
local MAX_DROPS = {REFILL_MAX_DROPS}
local UNCOUNTED = '{UNCOUNTED_SUFFIX}'
local DRAINED = '{DRAINED_SUFFIX}'
local WITHDRAWN = '{WITHDRAWN_SUFFIX}'
local UNCOUNTED_MARK = 'uncounted'  -- the job hash's mark, before the set (rolling upgrades)
"""
    + """
-- Jobs that ended in a lane, newest first and capped: what the console lists (no SCAN). The
-- list is trimmed back to RECENT_KEPT once it runs RECENT_SLACK past it, not on every write-back.
-- A script that does not declare the list (FINISH, which cannot: see its KEYS) leaves them out
-- of it while a migration has it elsewhere.
local function remember(stream, ids)
  if #ids == 0 then return end
  if (here('LPUSH', stream .. RECENT, unpack(ids)) or 0) > RECENT_KEPT + RECENT_SLACK then
    redis.call('LTRIM', stream .. RECENT, 0, RECENT_KEPT - 1)
  end
end
"""
    + LUA_UNDELIVERED
    + """
-- Credit that counts as a whole one: ten additions of 0.1 sum to 0.9999999999999999.
local WHOLE = 1 - 1e-9

-- A weight as deficit round robin spends it (`value` as recorded; none: 1), MIN_WEIGHT at least:
-- a key stored before weights were held to it may weigh 1e-310 (positive and finite), whose
-- turns to a whole credit (1 / weight) overflow to infinity, which nothing fast-forwarded:
-- refill turned the ring for good, the server BUSY until killed.
"""
    + f"local MIN_WEIGHT = {MIN_WEIGHT!r}\n"
    + """local function spent(value)
  return math.max(tonumber(value) or 1, MIN_WEIGHT)
end

-- Deficit round robin visits every tenant once a round and adds its weight to its credit; a
-- tenant of weight 0.001 beside one of weight 1 was visited a thousand times per job it moved,
-- each visit only adding credit: a TAKE of 8 beside 999 such tenants ran some 48,000 commands.
-- So the ring counts its rounds (the fair hash's `round`; `lr`, turns left in it: a round ends
-- once as many turns have ended as the ring held when it began), and a tenant whose turn leaves
-- it k > 1 rounds short of a whole credit is parked (PARKED, scored by round + k, `p:` the round
-- it was parked in) rather than sent to the back; `due` is the soonest round any parked tenant
-- waits for. The round that reaches it puts them back at the head of the ring with the credit
-- the rounds they missed would have added (`unpark`): a light tenant costs O(log n) per job it
-- moves, not a visit per round. Returns the round it waits for, or false: it goes to the back
-- as before (also while the slot migrates and the parked set is not here).
local function park(stream, fair, tenant, credit, weight, round)
  local k = math.ceil((WHOLE - credit) / weight)
  if k <= 1 or not select(2, here('ZADD', stream .. PARKED, round + k, tenant)) then
    return false
  end
  redis.call('HSET', fair, 'p:' .. tenant, round)
  return round + k
end

-- Parked `tenants` credited for the rounds they missed up to `round` (their own turn in it adds
-- the weight as any turn's does) and taken off the parked set.
local function unpark(stream, fair, tenants, round)
  for _, tenant in ipairs(tenants) do
    local h = redis.call('HMGET', fair, 'd:' .. tenant, 'w:' .. tenant, 'p:' .. tenant)
    local missed = math.max(0, round - (tonumber(h[3]) or round) - 1)
    redis.call('HSET', fair, 'd:' .. tenant, (tonumber(h[1]) or 0) + missed * spent(h[2]))
    redis.call('HDEL', fair, 'p:' .. tenant)
  end
  redis.call('ZREM', stream .. PARKED, unpack(tenants))
end

-- The next round of the ring: tenants parked for it (1,000 a round at most: the rest join the
-- next) go back at its head, soonest first; with no tenant left in the ring (all parked) it is
-- the round the soonest waits for, read from the set (`due` may name one that left it). Returns
-- the round, its turns (the ring's length: `lr`), the new `due` and whether the set was here.
local function next_round(stream, fair, ring, round, due, empty)
  local parked = stream .. PARKED
  round = round + 1
  if empty then
    local soonest, served = here('ZRANGE', parked, 0, 0, 'WITHSCORES')
    if not served then return round, 0, due, false end
    due = tonumber(soonest[2])
    if due then round = math.max(round, due) end
  end
  if due and due <= round then
    local tenants, served = here('ZRANGEBYSCORE', parked, '-inf', round, 'LIMIT', 0, 1000)
    if not served then return round, 0, due, false end
    if #tenants > 0 then
      unpark(stream, fair, tenants, round)
      local reversed = {}
      for i = #tenants, 1, -1 do reversed[#reversed + 1] = tenants[i] end
      redis.call('LPUSH', ring, unpack(reversed))
    end
    due = tonumber(redis.call('ZRANGE', parked, 0, 0, 'WITHSCORES')[2])
  end
  return round, redis.call('LLEN', ring), due, true
end

-- The recorded weights (`w:`) of the ring's tenants with jobs still held, summed, kept in the
-- fair hash (WSUM) so that a held job's position reads no weight per tenant: thousands of
-- one-job tenants made each held submit, and each GET of a held job, O(tenants) on the server.
-- A lane held since before the sum was kept counts it once from the ring (read-only, for
-- POSITION; the next hold writes it).
local function ring_weight(fair, ring)
  local sum = tonumber(redis.call('HGET', fair, WSUM))
  if sum then return sum end
  sum = 0
  for _, tenant in ipairs(here('LRANGE', ring, 0, -1) or {}) do
    sum = sum + (tonumber(redis.call('HGET', fair, 'w:' .. tenant)) or 0)
  end
  return sum
end

-- A tenant's weight is the highest of the weights its jobs still held were submitted with: a
-- raise counts at once (any of its keys may submit, so the highest is the share it can claim
-- anyway; the latest key's flipped a tenant with two keys between their weights, submit by
-- submit), a cut once the heavier jobs ahead of it are served (the highest since it last had
-- none held kept a tenant that swapped its weight-3 key for a weight-1 one at 3 for as long as its
-- flood never emptied). Kept as the maxima of a sliding window over its FIFO list: `w:` the
-- highest, and `c:` the lower levels its later jobs wait at, "b1 w2 b2 w3 ... wk": level i
-- holds until the job at place b_i (the last held at weight w_i, `hseq`) leaves the list; the
-- newest level's last job is the newest held. Both only while it has jobs still held. A flat
-- list {w1, b1, w2, ..., wk}.
local function levels(top, cuts)
  local out = {top}
  for value in string.gmatch(cuts or '', '%S+') do out[#out + 1] = tonumber(value) end
  return out
end

-- The fair hash's pairs that record `list` (see `levels`; `cuts`, the `c:` it replaces) and move
-- the ring's sum from `old` (`sum`: its value, none on a lane held since before it was kept,
-- which counts it itself). A tenant of one weight, the common case, has no `c:`.
local function weigh(tenant, list, old, sum, cuts)
  local out = {'w:' .. tenant, list[1]}
  if #list > 1 or (cuts and cuts ~= '') then
    out[#out + 1], out[#out + 2] = 'c:' .. tenant, table.concat(list, ' ', 2)
  end
  if sum then
    out[#out + 1], out[#out + 2] = WSUM, math.max(tonumber(sum) + list[1] - old, 0)
  end
  return out
end

-- A job of `tenant` about to be held, submitted at `weight` (none: a dead letter's replay, which
-- keeps its tenant's newest level; 1 if none), recorded (see `levels`): a lighter weight waits
-- behind the heavier jobs held before it, a heavier one replaces the levels it outweighs.
-- Returns the job's place among its tenant's holds (`n:`, its `hseq`), counted in the same
-- HSET: one HMGET and one HSET per held job, as the HINCRBY of `n:` and the weight's HMGET were.
-- A parked tenant whose weight rose goes back to the ring's tail, credited for the rounds it
-- missed: parked for the turns its old weight needed, it would wait them out.
local function record_weight(stream, tenant, weight, listed)
  local fair, ring = stream .. FAIR, stream .. FAIR_RING
  local h = redis.call('HMGET', fair, 'w:' .. tenant, WSUM, 'round', 'c:' .. tenant,
                       'o:' .. tenant)
  -- after the places taken off the list (`o:`) and the entries on it (`listed`): `n:` + 1 as
  -- this release alone numbers them, but an older one (80ccdc1) held entries unnumbered, and
  -- emptied lists without dropping `n:`, which numbered a job behind its holds as if first
  local place = (tonumber(h[5]) or 0) + listed + 1
  local old = tonumber(h[1]) or 0
  local list = old > 0 and levels(old, h[4]) or {}
  weight = weight or list[#list] or 1
  if weight == list[#list] and h[2] then
    redis.call('HSET', fair, 'n:' .. tenant, place)
    return place
  end
  local n = #list  -- the last level that outweighs this job, if any
  while n >= 1 and list[n] <= weight do n = n - 2 end
  if n < 1 then
    list = {weight}
  else
    if n == #list then list[n + 1] = place - 1 end  -- the job before this: the newest level's
    list[n + 2] = weight
    for i = #list, n + 3, -1 do list[i] = nil end
  end
  if old > 0 and list[1] > old and here('ZSCORE', stream .. PARKED, tenant) then
    unpark(stream, fair, {tenant}, tonumber(h[3]) or 0)
    redis.call('RPUSH', ring, tenant)
  end
  local out = weigh(tenant, list, old, h[2] or ring_weight(fair, ring), h[4])
  out[#out + 1], out[#out + 2] = 'n:' .. tenant, place
  redis.call('HSET', fair, unpack(out))
  return place
end

-- The levels of a tenant (`top`, `cuts`: its `w:` and `c:`) once the entries up to place
-- `taken` (`o:`) have left its list: the fair hash's pairs that record them, or nil if they
-- stand. The new weight is the first of the list.
local function served_levels(tenant, top, cuts, taken, sum)
  if not cuts or cuts == '' then return nil end
  local list = levels(tonumber(top), cuts)
  local first = 1
  while first + 2 <= #list and list[first + 1] <= taken do first = first + 2 end
  if first == 1 then return nil end
  return weigh(tenant, {unpack(list, first)}, list[1], sum, cuts)
end

-- A tenant left with no job still held (the rest of its list ended while held, or nothing
-- left): its weight leaves the sum, so that no position counts a turn of its in each round, and
-- its credit goes, as deficit round robin resets an emptied queue's: kept while its ended jobs'
-- entries waited for a refill to drop them, it moved the job the tenant sent next turns early.
local function unweigh(fair, tenant)
  local h = redis.call('HMGET', fair, 'w:' .. tenant, WSUM)
  redis.call('HDEL', fair, 'w:' .. tenant, 'c:' .. tenant, 'd:' .. tenant, 'p:' .. tenant)
  if h[1] and h[2] then
    redis.call('HSET', fair, WSUM, math.max(tonumber(h[2]) - tonumber(h[1]), 0))
  end
end

-- Held jobs `ids` of lane `stream` that left its held lists (moved into the stream, dropped):
-- off the lane's held jobs by submit time (SINCE). While a migration has the set elsewhere, they
-- stay there: the oldest-age read skips a job no longer held, and the set goes with the ring.
local function unheld(stream, ids)
  for i = 1, #ids, 1000 do  -- unpack's stack holds a few thousand values at most
    here('ZREM', stream .. SINCE, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- A tenant taken off the ring or the parked set (its held list emptied): its credit and weight
-- go, and its weight leaves the sum, which goes with the lane's last tenant (no float residue
-- outlives the ring), as does the lane's set of held jobs by submit time (nothing stale in it
-- outlives the ring).
local function leave(stream, tenant)
  local fair = stream .. FAIR
  redis.call('HDEL', fair, 'd:' .. tenant, 'e:' .. tenant, 'p:' .. tenant, 'n:' .. tenant,
             'o:' .. tenant)
  -- emptied: gone, which a migration answers as moved
  if (here('LLEN', stream .. FAIR_RING) or 0) + (here('ZCARD', stream .. PARKED) or 0) == 0 then
    redis.call('HDEL', fair, WSUM, 'w:' .. tenant, 'c:' .. tenant)
    here('DEL', stream .. SINCE)
  else
    unweigh(fair, tenant)
  end
end

-- A popped held entry that cannot move now (see `refill`) put back at the head of its list; or,
-- when its pop emptied the list (gone, which a migrating slot lets no script make again here),
-- moved into the stream after all, its hash not marked (not here): true then. Never dropped.
local function put_back(list, packed, stream)
  if select(2, here('LPUSH', list, packed)) then return false end
  redis.call('XADD', stream, '*', MOVED, '1', unpack(cmsgpack.unpack(packed)))
  return true
end

-- A tenant's weight levels (`cuts`, its `c:`: see `levels`) once a sweep renumbered its kept
-- entries after `first` (their indexes in the list before, `at`; their places were `taken`, its
-- `o:`, plus those): a level lasts until the last of its jobs a sweep kept leaves the list, and
-- read by the places before, until entries behind it left in its stead.
local function renumber_levels(cuts, taken, at, first)
  local out, k = {}, 0
  for value in string.gmatch(cuts, '%S+') do
    if #out % 2 == 0 then  -- a level's last place, then the next level's weight
      while k < #at and taken + at[k + 1] <= tonumber(value) do k = k + 1 end
      value = first + k
    end
    out[#out + 1] = value
  end
  return table.concat(out, ' ')
end

-- A tenant's held list at ENQUEUE's bound (2 x max_length entries) loses its entries of jobs
-- that ended while held, the order of the rest kept: such an entry left the `held` count when its
-- job ended, and only a refill drops it, which runs only while a worker reads and jobs are held,
-- so a tenant that submits and cancels would grow its list without bound. Its live entries are
-- fewer than `held`, which admission holds under max_length, so a sweep drops max_length entries
-- at least: one O(list) sweep per max_length submits at most (swept at max_length, a tenant with
-- nearly max_length live held jobs was swept every few submits). One whose hash is gone (never
-- uncounted), or whose job another entry moved in already (`waits`), leaves the count as a
-- refill's drop does. Returns the list's length.
local function sweep(stream, job_prefix, tenant)
  local list = stream .. HELD .. tenant
  local kept, hashes, counted, gone = {}, {}, 0, {}
  local at = {}  -- the kept entries' indexes in the list (their places less `o:`)
  for index, packed in ipairs(redis.call('LRANGE', list, 0, -1)) do
    local jid = field(cmsgpack.unpack(packed), 'id') or ''
    local jk = jobkey(job_prefix, jid)
    local job = redis.call('HMGET', jk, 'status', 'held')
    if waits(job) then
      kept[#kept + 1], hashes[#hashes + 1], at[#at + 1] = packed, jk, index
    else
      gone[#gone + 1] = jid
      if redis.call('SREM', stream .. UNCOUNTED, jid) == 0 and job[2] ~= UNCOUNTED_MARK then
        counted = counted + 1
      end
    end
  end
  redis.call('DEL', list, stream .. ENDED .. tenant)  -- no ended job's entry left
  for i = 1, #kept, 1000 do  -- unpack's stack holds a few thousand values at most
    redis.call('RPUSH', list, unpack(kept, i, math.min(i + 999, #kept)))
  end
  unheld(stream, gone)
  if #kept == 0 then
    redis.call('LREM', stream .. FAIR_RING, 0, tenant)
    redis.call('ZREM', stream .. PARKED, tenant)
    leave(stream, tenant)
  else
    redis.call('HDEL', stream .. FAIR, 'e:' .. tenant)
    -- the kept entries numbered again up to the last held (`n:`), in their order: a place less
    -- `o:` counts the entries ahead of it only while the places run with no gap, and counted
    -- from the last, a job read the swept places after it as taken off ahead of it
    local f = redis.call('HMGET', stream .. FAIR, 'n:' .. tenant, 'o:' .. tenant, 'c:' .. tenant)
    local holds = tonumber(f[1])
    if holds then
      local renumbered = {'o:' .. tenant, holds - #kept}
      if f[3] and f[3] ~= '' then  -- its weight levels' places too (see `levels`)
        renumbered[3] = 'c:' .. tenant
        renumbered[4] = renumber_levels(f[3], tonumber(f[2]) or 0, at, holds - #kept)
      end
      redis.call('HSET', stream .. FAIR, unpack(renumbered))
      for i, jk in ipairs(hashes) do redis.call('HSET', jk, 'hseq', holds - #kept + i) end
    end
  end
  if counted > 0 then
    local left = (tonumber(redis.call('HGET', stream .. FAIR, 'held')) or 0) - counted
    redis.call('HSET', stream .. FAIR, 'held', math.max(left, 0))
  end
  return #kept
end

-- The jobs a fair lane holds, counted off its tenants' lists (the ring's and the parked set's:
-- each list's entries less those of its jobs that ended while held, `e:`), for a `held` count
-- of none while a tenant is parked (`due`). A release before parking (80ccdc1) sees no parked
-- set: its refill, finding the ring empty, wrote `held` 0, and the parked tenant's jobs were
-- never moved, even once every worker was upgraded. Made only in that state, never when the
-- count says jobs are held; a list not here (its slot migrating) counts none. That state is
-- also this release's own once a parked tenant's held jobs all ended while held (their entries
-- still listed, in `e:`): a parked tenant with no live entry is swept (`sweep`: its list, its
-- ended places and their UNCOUNTED ids go, and it leaves the lane), and `due` goes with the
-- last parked tenant, so that the lane's next refills (each TAKE, each FINISH) make no recount
-- that would find the same nothing; a sweep a migration stops leaves it for a later refill.
local function recount(stream, job_prefix, fair, ring)
  local tenants, served = here('LRANGE', ring, 0, -1)
  local parked, also = here('ZRANGE', stream .. PARKED, 0, -1)
  if not (served and also) then return 0 end
  local waits_round = {}  -- the parked tenants, swept when they hold nothing live
  for _, tenant in ipairs(parked) do
    tenants[#tenants + 1], waits_round[tenant] = tenant, true
  end
  local count, seen, swept = 0, {}, 0  -- seen: a tenant in both (the older sweep left it parked)
  for _, tenant in ipairs(tenants) do
    if not seen[tenant] then
      seen[tenant] = true
      local entries, listed = here('LLEN', stream .. HELD .. tenant)
      local ended = tonumber(redis.call('HGET', fair, 'e:' .. tenant)) or 0
      local live = math.max(0, (entries or 0) - ended)
      if live == 0 and listed and waits_round[tenant] then
        live = here_all(sweep, stream, job_prefix, tenant)
        if live == 0 then swept = swept + 1 end  -- nil: not here, still parked
      end
      count = count + (live or 0)
    end
  end
  if swept == #parked then redis.call('HDEL', fair, 'due') end
  return count
end

-- Fair lanes: move held entries into the stream by weighted deficit round robin until it holds
-- `upto` undelivered ones: a read, the micro-batch it is about to take; anything else, one, so
-- that a worker blocked on the stream wakes. Entries moved in are committed ahead of any tenant
-- that comes later, so no more are moved than the next read takes. The tenant at the head of the
-- ring gets `weight` more credit when its turn starts and moves one entry per credit; a tenant
-- whose list empties leaves the ring (its credit reset), one out of credit goes to the back, or
-- is parked until its round if more than one round short of a credit (`park`). A turn cut short
-- (the stream full) keeps the tenant at the head with its credit and ends no turn. A
-- moved job gets its `seq` then (it joins the stream now; the lane's counter is read once and
-- grown once for all the refill moves), and its entry the MOVED field (so a worker that reads it
-- knows more may be held); a held job no longer queued (cancelled, gone) or moved in already by
-- another entry of it (`waits`) is dropped, so it never reaches a worker (twice), and costs its
-- tenant no credit (one that ended held left the `held` count when it ended: TRANSITION put its
-- id in the lane's UNCOUNTED set, which outlives its hash).
-- One call drops MAX_DROPS entries at most (a tenant's list of cancelled jobs would otherwise
-- hold the server for as long as it takes to drop them all) and leaves the rest to the next
-- refill; one that stops so having moved nothing while jobs are still held moves the entry of
-- an ended job it dropped last in after all (MOVED), so that a worker blocked on the stream
-- wakes, treats it as any job cancelled once in the stream (no result of it is written) and
-- takes again. While the
-- slot migrates, a move that needs a key not here (a job's hash, the tenant's list, the lane's
-- counters: not declared) puts its entry back and ends the refill there, nothing half moved;
-- a lane whose fair hash is not here moves none.
local function refill(stream, group, job_prefix, upto)
  local fair, ring, held = stream .. FAIR, stream .. FAIR_RING, stream .. HELD
  local s = here('HMGET', fair, 'held', 'round', 'lr', 'due') or {}
  local left = tonumber(s[1]) or 0
  if left <= 0 and s[4] then  -- a tenant parked
    left = recount(stream, job_prefix, fair, ring)
  end
  if left <= 0 then return end
  local round, lr, due = tonumber(s[2]) or 0, tonumber(s[3]) or 0, tonumber(s[4])
  local lr_was = lr
  local room = upto - undelivered(stream, group)
  local added, moved = nil, 0
  local drops, dropped = 0, nil  -- dropped: the entry dropped last
  local gone = {}  -- ids of the held jobs taken off the lists (moved in or dropped)
  local stalled = false  -- a key the next move needs is not here (see `here`)
  while room > 0 and left > 0 and drops < MAX_DROPS and not stalled do
    local tenant, served = here('LINDEX', ring, 0)
    if not served then break end
    if lr <= 0 or not tenant then
      round, lr, due, served = next_round(stream, fair, ring, round, due, not tenant)
      if not served then break end
      tenant = redis.call('LINDEX', ring, 0)
      if not tenant then left = 0; break end
    end
    local list = held .. tenant
    local h = redis.call('HMGET', fair, 'd:' .. tenant, 'w:' .. tenant, 'e:' .. tenant,
                         'o:' .. tenant, 'c:' .. tenant, WSUM)
    local credit, ended = tonumber(h[1]) or 0, tonumber(h[3]) or 0  -- ended: see `live`
    local popped = 0  -- entries the turn took off the list (`o:`, see POSITION)
    if credit < WHOLE then credit = credit + spent(h[2]) end
    while credit >= WHOLE and room > 0 and drops < MAX_DROPS do
      local packed
      packed, served = here('LPOP', list)
      stalled = not served
      if not packed then break end
      local entry = cmsgpack.unpack(packed)
      local jid = field(entry, 'id') or ''
      local jk = jobkey(job_prefix, jid)
      local job, runs, uncounted, count
      job, served = here('HMGET', jk, 'status', 'held')
      runs = served and waits(job)
      if served and not runs then
        uncounted, served = here('SREM', stream .. UNCOUNTED, jid)
      elseif served and not added then
        count, served = here('GET', stream .. ADDED)
        added = served and (tonumber(count) or 0) or nil
      end
      if not served then  -- back in its place, for the first refill after the migration
        stalled = true
        if put_back(list, packed, stream) then
          left, moved, gone[#gone + 1], popped = left - 1, moved + 1, jid, popped + 1
        end
        break
      end
      left, gone[#gone + 1], popped = left - 1, jid, popped + 1
      if not runs then  -- dropped: costs no credit
        -- its end took it off the count (the set, or the hash's mark: a rolling upgrade)
        if uncounted == 1 or job[2] == UNCOUNTED_MARK then
          left, ended = left + 1, math.max(ended - 1, 0)
        end
        drops = drops + 1
        -- the wake-up's entry (below) only a job that ended: one moved in by another entry
        -- waits in the stream or runs, and a second entry of it would run it twice
        if not can(job[1], 'running') then dropped = entry end
      else
        local eid = redis.call('XADD', stream, '*', MOVED, '1', unpack(entry))
        moved = moved + 1
        redis.call('HSET', jk, 'seq', added + moved, 'entry', eid)
        redis.call('HDEL', jk, 'held', 'hseq')
        room = room - 1
        credit = credit - 1
      end
    end
    local turn = {'d:' .. tenant, credit}  -- what the turn leaves in the fair hash
    local weight = spent(h[2])  -- the next turn's: a cut counts once its heavier jobs left
    if h[3] then turn[#turn + 1], turn[#turn + 2] = 'e:' .. tenant, ended end
    if popped > 0 then
      local taken = (tonumber(h[4]) or 0) + popped
      turn[#turn + 1], turn[#turn + 2] = 'o:' .. tenant, taken
      if (tonumber(h[3]) or 0) > 0 then  -- the places of ended jobs it popped go too
        here('ZREMRANGEBYSCORE', stream .. ENDED .. tenant, '-inf', taken)
      end
      local cut = served_levels(tenant, h[2], h[5], taken, h[6])
      if cut then
        for _, value in ipairs(cut) do turn[#turn + 1] = value end
        weight = spent(cut[2])
      end
    end
    if stalled then  -- the tenant's turn goes on in the next refill, its credit kept
      redis.call('HSET', fair, unpack(turn))
      break
    end
    local entries = here('LLEN', list) or 0
    if entries == 0 then  -- emptied: gone, which a migration answers as moved
      redis.call('LPOP', ring)
      leave(stream, tenant)
      lr = lr - 1
    else
      redis.call('HSET', fair, unpack(turn))
      if credit < WHOLE then  -- the turn ends
        local parked = park(stream, fair, tenant, credit, weight, round)
        if parked then
          redis.call('LPOP', ring)
          due = math.min(due or parked, parked)
        else
          redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
        end
        lr = lr - 1
      end
      if entries <= ended then unweigh(fair, tenant) end  -- only ended jobs' entries left
    end
  end
  if drops >= MAX_DROPS and moved == 0 and room > 0 and left > 0 and dropped then
    redis.call('XADD', stream, '*', MOVED, '1', unpack(dropped))  -- the wake-up (see above)
    moved = 1
  end
  local counts = {'held', math.max(left, 0)}  -- one HSET for what the refill changed
  if lr ~= lr_was or round ~= (tonumber(s[2]) or 0) then
    counts[3], counts[4], counts[5], counts[6] = 'round', round, 'lr', lr
  end
  if due ~= tonumber(s[4]) then
    if due then
      counts[#counts + 1], counts[#counts + 2] = 'due', due
    else
      redis.call('HDEL', fair, 'due')
    end
  end
  redis.call('HSET', fair, unpack(counts))
  if moved > 0 then here('INCRBY', stream .. ADDED, moved) end
  unheld(stream, gone)
end

-- Held jobs that deficit round robin moves into the stream before a job of a tenant of weight
-- `weight` (`mine` in the ring's sum: 0 for one with no job held yet) with `own` of its tenant's
-- held jobs ahead of it: those, and per round the other tenants' weights' worth, for as many
-- rounds as the tenant needs to reach it; at most `held`. Jobs that ended while held count in
-- none of these (the `e:` counts, `unweigh`), though their entries wait for a refill to drop.
local function held_ahead(stream, weight, mine, held, own)
  local fair = stream .. FAIR
  local others = math.max(0, ring_weight(fair, stream .. FAIR_RING) - mine)
  local rounds = math.ceil((own + 1) / weight)
  return math.max(0, math.min(held, own + math.floor(rounds * others)))
end
"""
)

# For the scripts that end jobs with webhooks (FINISH, RECLAIM, TRANSITION): a job's event is
# owed from the step that ends it, so a worker that dies before it hands the event to the broker
# loses none (the reclaimer re-sends it: workers/partition/reclaim.py). The set lives as long as
# the hashes it names, which the event is built from.
_OWE = (
    f"""
local OWED = '{WEBHOOKS_OWED_SUFFIX}'
"""
    + """
-- Jobs `ids` of lane `stream`, ended at `at` (ms), owe their webhook events. A script that does
-- not declare the set owes none while a migration has it elsewhere: the caller hands the events
-- over all the same, only not re-sent should it die first (FINISH declares the set).
local function owe(stream, ids, at, ttl)
  if #ids == 0 then return end
  local scored = {}
  for _, jid in ipairs(ids) do
    table.insert(scored, at)
    table.insert(scored, jid)
  end
  if select(2, here('ZADD', stream .. OWED, unpack(scored))) then
    redis.call('EXPIRE', stream .. OWED, ttl)
  end
end
"""
)

# KEYS: streams in order of preference (lanes); ARGV: group, consumer, count, job-key prefix,
# now_ms, mark ('1': mark the jobs running, as a generate loop wants; '': only read their status).
# Non-blocking XREADGROUP of the first stream that has new entries, plus each job's status, in one
# round trip; returns {index of that stream (0: none), {entry_id, fields, status} triples}. Fair
# lanes are refilled from their held jobs in turn, each up to the micro-batch just before it is
# read; once one is read, those after it up to one entry only: a lane left empty with jobs held
# would strand them under a worker that next blocks on its stream, but a micro-batch moved into
# a lane not read is committed ahead of every tenant that comes before the next read of it.
TAKE = (
    _PRELUDE
    + """
for k = 1, #KEYS do
  refill(KEYS[k], ARGV[1], ARGV[4], tonumber(ARGV[3]))
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                         'STREAMS', KEYS[k], '>')
  if res then
    for later = k + 1, #KEYS do refill(KEYS[later], ARGV[1], ARGV[4], 1) end
    local out = {}
    for _, e in ipairs(res[1][2]) do
      local jid = field(e[2], 'id')
      local status = 'missing'
      if jid and ARGV[6] == '1' then
        status = claim(jobkey(ARGV[4], jid), ARGV[5], ARGV[2], 1)
      elseif jid then
        local read, served = here('HGET', jobkey(ARGV[4], jid), 'status')
        status = not served and 'queued' or read or 'missing'  -- not here: as `claim` reads it
      end
      table.insert(out, {e[1], e[2], status})
    end
    return {k, out}
  end
end
return {0, {}}
"""
)

# KEYS: the jobs' hashes (one partition's, so one slot: a cluster routes the call by them);
# ARGV: worker, then per job: started_ms, attempt → statuses after. Marks jobs a plain XREADGROUP
# delivered as running, when their run is long enough to be seen.
MARK_RUNNING = (
    _PRELUDE
    + """
local out = {}
for k = 1, #KEYS do
  table.insert(out, claim(KEYS[k], ARGV[2 * k], ARGV[1], ARGV[2 * k + 1]))
end
return out
"""
)

# KEYS[1]=a lane's stream, KEYS[2]=its added counter, KEYS[3...]=the keys of the jobs to enqueue
# (in the lane's slot); ARGV: max_length (0: none), ttl_s, group, fair window (0: not a fair
# lane), job-key prefix, the lane's floor ('': none; see below), then per job: max_ahead (-1:
# none; UNPLACED: none, and its caller does not read its position), the tenant's weight ('':
# none given, a dead letter's replay, which keeps the weight recorded for the tenant, else 1), n
# hash pairs, m entry pairs, may_exist (1: an id used before, a dead letter's replay), the
# hash's n field/value pairs, the entry's m. One reply per job, in order.
# Admission control and enqueue in one atomic step per job, as if each came alone in turn (the
# lane's length read once, then counted on): a full partition (stream plus held jobs) refuses
# ({0, length}), so does one with more than max_ahead entries undelivered ({2, ahead}: the job
# would miss its deadline); nothing accepted is ever trimmed. Accepted: {1, ahead, seq, floor},
# where ahead = XLEN - pending (every acknowledged entry is deleted) and seq numbers the job's
# entry in its lane (stored in the hash; shared/queue_position.py reads positions from it); ahead
# is -1, not counted, for an UNPLACED job of a plain lane: a call of only such jobs (submit-and-
# wait's, a batch's items) reads no XPENDING, nor XLEN while the floor it is given shows the lane
# below max_length (`below_bound`): `floor` (seq less the length, in a reply only where the call
# read the length) is what the producer gives the lane's next calls. A job one of whose commands
# fails (a key of the wrong type) replies {-1, the error} and fails alone: the call's other jobs
# are enqueued or refused as they would be without it.
# A fair lane whose stream holds `window` undelivered entries, or that holds jobs back already,
# holds the job in its tenant's list instead (hash field `held` = 1, no seq until it joins the
# stream; reply {1, ahead, 0}, even when the refill that follows it fails on another tenant's
# key: that error is logged, not the job's) for refill (TAKE, FINISH) to move by deficit round
# robin; its ahead counts the held jobs the round robin serves first, and so does deadline
# admission. A tenant's list that holds 2 x max_length entries is swept of its ended jobs'
# entries first (`sweep`), so it holds at most that many.
# A job whose hash exists already changes nothing (reply {1, 0, its seq}; its `created` is
# written again, as it is, for a replica WAIT): a call retried after its reply was lost (a
# connection torn mid-pipeline, a failover) must not enqueue it twice. A retry resends the call
# as it was (redis-py sends the pipeline again; group commit sends a merged call again when a
# restarted server refused it for NOSCRIPT), so one EXISTS per call tells a rerun: of its first
# job's hash, or of the marker (REFUSED_SUFFIX) a call leaves that refused its first job and
# wrote a later one; only then, and for a job marked may_exist or named twice in the call, is
# each job's hash looked for.
# Many jobs per call (the submits of one event-loop turn) share its fixed cost: the call, the
# prelude, the EXISTS above, reading the lane's length (XLEN) and pending count (XPENDING), each
# read only once a job needs it, and the counter's INCRBY.
_ENQUEUE_BODY = (
    f"""
local UNPLACED = {UNPLACED}
"""
    + """
local stream, added = KEYS[1], KEYS[2]
local max_length, ttl, group = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local window, job_prefix, floor = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local rerun = redis.call('EXISTS', KEYS[3], KEYS[3] .. REFUSED) > 0
local named = {}  -- the call's job keys so far
local wrote = false  -- whether the call has written a job
local length, pending  -- the lane's, read when first wanted and counted on (re-read after refill)
-- The lane's counter is grown once, at a call's first accepted job, by as many jobs as the call
-- has left (so one INCRBY numbers them all when all are accepted), and what refusals left unused
-- is given back when settled (before a refill, which numbers the jobs it moves, and at the end).
local seq, unused = nil, 0  -- the last number handed out (or before the call's), those kept
local unhashed  -- the entry XADD just added for a job whose hash is not written yet (`failed`)

-- The number the call's next entry takes (its numbers kept here, if not yet).
local function upcoming(left)
  if not seq then seq, unused = redis.call('INCRBY', added, left) - left, left end
  return seq + 1
end

local function next_seq(left)
  local n = upcoming(left)
  seq, unused = n, unused - 1
  return n
end

-- Whether a plain lane is shown below its max_length without reading its length. Entries join
-- it only numbered by its counter (every release numbers them, and gives back what it kept
-- unused) and leave it, so its length is at most the highest number handed out less `floor`:
-- that number less the length, at a read of it the producer was told of (ENQUEUE's reply) and
-- hands back. A floor above the numbers (the counter lost since) shows nothing. A failover that
-- lost writes may leave a floor read after them too high by the entries those writes drained:
-- the lane then takes as many (max_length at most) past its cap until the length is read.
local function below_bound(left)
  if max_length == 0 then return true end
  if not floor then return false end
  local handed = upcoming(left) - 1
  return handed >= floor and handed - floor < max_length
end

local function settle()
  if unused > 0 then redis.call('INCRBY', added, -unused) end
  seq, unused = nil, 0
end

-- A caught error's text (a command's error is a table, a script's own a string).
local function message(err)
  return type(err) == 'table' and err.err or tostring(err)
end

-- The job whose hash is `jk`, its hash pairs ARGV[first..entry - 1], its entry's ARGV[entry..last].
local function enqueue(jk, max_ahead, weight, may_exist, left, first, entry, last)
  local check = rerun or may_exist or named[jk]
  named[jk] = true
  if check and redis.call('EXISTS', jk) == 1 then
    -- written again as it is, so that a replica WAIT behind this rerun (on a connection of its
    -- own, which wrote nothing) waits for the job rather than returning at once
    local h = redis.call('HMGET', jk, 'seq', 'created')
    if h[2] then redis.call('HSET', jk, 'created', h[2]) end
    return {1, 0, tonumber(h[1]) or 0}
  end
  -- the length only where a place needs it, or the floor does not show the bound: a plain
  -- lane's UNPLACED jobs read none while far from full (benchmark part D)
  local placed = window > 0 or max_ahead ~= UNPLACED
  if not length and (placed or not below_bound(left)) then
    length, pending = redis.call('XLEN', stream), nil
  end
  local held = window > 0 and (tonumber(redis.call('HGET', stream .. FAIR, 'held')) or 0) or 0
  if length and max_length > 0 and length + held >= max_length then
    return {0, length + held}
  end
  local ahead = -1  -- not counted: no bound and its position not asked for, on a plain lane
  if placed then
    if not pending then
      local ok, pel = pcall(redis.call, 'XPENDING', stream, group)
      pending = ok and pel[1] or 0
    end
    ahead = math.max(0, length - pending)
  end
  local hold = window > 0 and (held > 0 or ahead >= window)
  local fields, tenant, own_weight  -- own_weight: the job's key's weight (none: a replay)
  local listed  -- the entries in the tenant's held list before this job
  if hold then
    fields = {unpack(ARGV, entry, last)}
    tenant = field(fields, 'tenant') or 'default'
    -- the tenant's weight once this job is held (see record_weight); a replay gives none
    local h = redis.call('HMGET', stream .. FAIR, 'w:' .. tenant, 'e:' .. tenant)
    local recorded = tonumber(h[1])  -- its weight in the ring's sum (none: not in it)
    own_weight = weight ~= '' and spent(weight) or nil
    weight = spent(own_weight and math.max(own_weight, recorded or 0) or recorded)
    listed = redis.call('LLEN', stream .. HELD .. tenant)
    local own = listed - (tonumber(h[2]) or 0)  -- its jobs still held
    if max_length > 0 and listed >= 2 * max_length then
      own = sweep(stream, job_prefix, tenant)
      listed = own  -- the sweep kept only those
      if own == 0 then recorded = nil end  -- swept out of the ring
    end
    ahead = ahead + held_ahead(stream, weight, recorded or 0, held, own)
  end
  if max_ahead >= 0 and ahead > max_ahead then return {2, ahead} end
  -- ARGV's pairs go to HSET and XADD as they are: copying them into tables took a fifth of
  -- a lone job's script time. The hash keeps its entry's id (`entry`), which a cancel deletes
  -- while no consumer has been handed it (TRANSITION): no command more than before; and its
  -- lane (`stream`, where its position is read), KEYS[1], not sent again among its pairs.
  local mark, value, eid = 'held', 1, nil
  if not hold then
    mark, value = 'seq', next_seq(left)
    eid = redis.call('XADD', stream, '*', unpack(ARGV, entry, last))
    length, unhashed = length and length + 1, eid
  end
  if hold then  -- `hseq`: its place among its tenant's holds (`n:`, see POSITION)
    local place = record_weight(stream, tenant, own_weight, listed)
    redis.call('HSET', jk, mark, value, 'hseq', place, 'entry', '', 'stream', stream,
               unpack(ARGV, first, entry - 1))
  else
    redis.call('HSET', jk, mark, value, 'entry', eid or '', 'stream', stream,
               unpack(ARGV, first, entry - 1))
    unhashed = nil
  end
  redis.call('EXPIRE', jk, ttl)
  wrote = true
  -- a floor from the length read (none if not read): for the producer to hand back
  if not hold then return {1, ahead, value, length and value - length} end
  if redis.call('RPUSH', stream .. HELD .. tenant, cmsgpack.pack(fields)) == 1 then
    redis.call('RPUSH', stream .. FAIR_RING, tenant)
  end
  local enq = tonumber(field(fields, 'enq'))
  if enq then here('ZADD', stream .. SINCE, enq, field(fields, 'id')) end
  redis.call('HINCRBY', stream .. FAIR, 'held', 1)
  settle()
  -- the lane's step, not the job's: the job is written, and admitted whatever the refill meets
  -- (another tenant's list of the wrong type failed it, and told this job's caller it failed:
  -- a retry enqueued it twice); the error is logged, and the lane's next refill meets it again
  local moved, err = pcall(refill, stream, group, job_prefix, 1)
  if not moved then redis.log(redis.LOG_WARNING, 'refill of ' .. stream .. ': ' .. message(err)) end
  length = nil  -- refill may have moved held jobs into the stream
  return {1, ahead, 0}
end

-- A job one of whose commands fails (a key of its own, or its tenant's, of the wrong type) fails
-- alone, {-1, the error}: the call goes on with the next job. A merged call serves the submits
-- of many callers, and its error failed them all while the jobs it had written stayed enqueued.
-- What the job wrote before the error stays (a script is not rolled back), but for an entry
-- whose hash its HSET could not write (its key of the wrong type): deleted, with its number,
-- as no worker could read it (TAKE's `claim` failed on the key, every read of the lane with it).
-- The lane's counter gives back the numbers it kept for the jobs after it, and its length is
-- read anew.
local function failed(err)
  if unhashed then
    redis.call('XDEL', stream, unhashed)
    unused, unhashed = unused + 1, nil
  end
  settle()
  length = nil
  return {-1, message(err)}
end

local out, i = {}, 7
for k = 3, #KEYS do
  local first = i + 5
  local entry = first + tonumber(ARGV[i + 2]) * 2
  local last = entry + tonumber(ARGV[i + 3]) * 2 - 1
  local may_exist = ARGV[i + 4] == '1'
  local left = #KEYS - k + 1  -- this job and those after it
  local ok, reply = pcall(enqueue, KEYS[k], tonumber(ARGV[i]), ARGV[i + 1], may_exist, left,
                          first, entry, last)
  out[k - 2] = ok and reply or failed(reply)
  i = last + 1
end
settle()
-- A call that refused its first job and wrote a later one leaves a marker, so that its rerun is
-- known as one (a call that wrote nothing may well run again as if for the first time).
if out[1][1] ~= 1 and wrote then redis.call('SET', KEYS[3] .. REFUSED, 1, 'EX', REFUSED_TTL) end
return out
"""
)
ENQUEUE = _PRELUDE + _ENQUEUE_BODY

# ENQUEUE's KEYS and ARGV for one job (a dead letter's replay, its id the letter's replay id),
# then KEYS[4]=the partition's dead-letter stream (in the lane's slot), ARGV[#ARGV]=the letter's
# id. ENQUEUE's call, which removes the letter once its job is admitted, run only while the
# letter is there or its replay's job is (replayed by another replay: ENQUEUE leaves it alone,
# one job however many replays read the letter): a letter is replayed or purged, never both (a
# purge between a replay's read and its enqueue reported the letter discarded while the replay
# enqueued it). Reply as ENQUEUE's, or {{3, 0}} where the letter is gone and no job replays it.
REPLAY_LETTER = (
    _PRELUDE
    + """
local dlq, letter = table.remove(KEYS), table.remove(ARGV)
if #redis.call('XRANGE', dlq, letter, letter) == 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  return {{3, 0}}
end
local function enqueue_all()
"""
    + _ENQUEUE_BODY
    + """
end
local out = enqueue_all()
if out[1][1] == 1 then redis.call('XDEL', dlq, letter) end
return out
"""
)

# KEYS[1]=stream, KEYS[2]=dead-letter stream; ARGV: group, consumer, min_idle_ms, count, job-key
# prefix, now_ms, max_deliveries, ttl_s, token-stream key prefix, token_ttl_s, then the ids of the
# stream's entries the consumer still runs (none: all its idle ones are abandoned). Takes over
# entries idle past the visibility timeout (a dead or stuck consumer's); past max_deliveries they
# move to the DLQ and their job fails with the reason (row status 'dead'; 'dead-ended' when the job
# had already ended) and its token stream, if any, gets no more than the short TTL a finished one
# gets (token_ttl_s: its writer, dead, never wrote its `final`, and it kept the result TTL);
# otherwise they are claimed for running again. Rows: {entry_id, fields, status, deliveries}. The
# consumer that abandoned an entry (listed by XPENDING before XCLAIM makes it ours) goes on the
# job's attempt history: `crashed`, or `dead-lettered` for the last one. A dead job joins the lane's
# recent list, and one with a webhook the lane's owed set (the caller hands its event over, then
# takes it off); the caller frees its in-flight slot (named by the entry). The caller's own entries
# that it still runs went idle only while an outage failed their touches: they are left as they are
# (no delivery counted, no attempt, never dead-lettered while they run), and the scan reaches past
# them to the first `count` others (XCLAIMed by id: from the list's head, XAUTOCLAIM's COUNT*10
# scan, COUNT 1 for a micro-batch loop, never got past 10 live entries ahead, other workers' long
# micro-batches, to the abandoned ones behind them). Its own that it does not run (a process
# restarted under the same name) are abandoned as others'. While the slot migrates, a job whose hash
# is not here is handed over unmarked (`claim`), and an entry past max_deliveries whose job's hash
# is not here stays pending with this consumer: it is dead-lettered by the first reclaim after the
# migration, its job failed with it, not left running.
RECLAIM = (
    _PRELUDE
    + _OWE
    + """
local out = {}

-- Entry `eid` (`fields`), past max_deliveries, to the DLQ; its job (hash `jk`, its status and
-- webhook in `job`) failed with the reason, unless it had ended already.
local function dead_letter(eid, fields, owner, deliveries, jk, job)
  local jid = field(fields, 'id')
  local reason = 'dead-lettered after ' .. deliveries .. ' deliveries without finishing'
    .. ' (max_deliveries ' .. ARGV[7] .. ')'
  local dead = {'entry', eid, 'lane', KEYS[1], 'reason', reason, 'deliveries', deliveries}
  for i = 1, #fields do table.insert(dead, fields[i]) end
  redis.call('XADD', KEYS[2], '*', unpack(dead))
  -- its token stream lives no longer than a finished one's: undeclared, as its hash (same slot)
  if jid then here('EXPIRE', jobkey(ARGV[9], jid), ARGV[10], 'LT') end
  local fate = 'dead-ended'
  if jk and can(job[1], 'failed') then
    fate = 'dead'
    if job[2] then owe(KEYS[1], {jid}, ARGV[6], ARGV[8]) end
    local err = cjson.encode({type = 'DeadLettered', message = reason})
    local args = {'status', 'failed', 'error', err, 'finished', ARGV[6]}
    if owner then
      table.insert(args, 'attempt_history')
      table.insert(args, abandoned(jk, owner, ARGV[6], 'dead-lettered', err))
    end
    redis.call('HSET', jk, unpack(args))
    redis.call('EXPIRE', jk, ARGV[8], 'GT')
    local reply = field(fields, 'reply')
    if reply and reply ~= '' then
      local m = redis.call('HMGET', jk, 'model', 'variant')
      redis.call('SPUBLISH', reply, cjson.encode({id = jid, status = 'failed', model = m[1],
        variant = m[2], error = {type = 'DeadLettered', message = reason}}))
    end
  end
  redis.call('XACK', KEYS[1], ARGV[1], eid)
  redis.call('XDEL', KEYS[1], eid)
  if fate == 'dead' then remember(KEYS[1], {jid}) end
  table.insert(out, {eid, fields, fate, deliveries})
end

-- The idle entries to take over (XPENDING rows by id, and their ids in order): the first
-- `count` that are not the caller's own still running (ARGV[11..]).
local function abandoned_rows()
  local running, count = {}, tonumber(ARGV[4])
  for i = 11, #ARGV do running[ARGV[i]] = true end
  local scan = count + #ARGV - 10  -- past those in hand, however many of them come first
  local owners, ids = {}, {}
  for _, row in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', scan)) do
    if #ids < count and not (row[2] == ARGV[2] and running[row[1]]) then
      owners[row[1]], ids[#ids + 1] = row, row[1]
    end
  end
  return owners, ids
end

local owners, ids = abandoned_rows()
-- one delivery more each; an entry deleted while pending leaves the list and is not returned
local claimed = #ids > 0 and redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3],
  unpack(ids)) or {}
for _, e in ipairs(claimed) do
  local eid, fields, owner = e[1], e[2], owners[e[1]]
  local deliveries = tonumber(owner[4]) + 1
  local jid = field(fields, 'id')
  local jk = jid and jobkey(ARGV[5], jid)
  if deliveries > tonumber(ARGV[7]) then
    local job, served = {}, true
    if jk then job, served = here('HMGET', jk, 'status', 'webhook') end
    -- the deliveries it had: this takeover, only to dead-letter it, runs nothing
    if served then dead_letter(eid, fields, owner, deliveries - 1, jk, job) end
  else
    local status = jk and claim(jk, ARGV[6], ARGV[2], deliveries, owner) or 'missing'
    table.insert(out, {eid, fields, status, deliveries})
  end
end
refill(KEYS[1], ARGV[1], ARGV[5], 1)  -- a dead-lettered entry leaves a fair lane's stream
return out
"""
)

# KEYS[1]=stream, then the hashes of the jobs whose results it writes, and the lane's owed set
# when one of them has a webhook: declared, so that a migrating slot refuses the call whole
# (TRYAGAIN, or ASK once all have moved) rather than part-way. The lane's recent list and this
# second's drained counter (DRAINED, named here) are not: they may exist nowhere yet, and a
# declared key that exists nowhere is refused for the whole migration; while one is not here,
# its write is left out (`here`).
# ARGV: group, ttl_s, job-key prefix, worker, renew_before (a job `created` before it gets its
# hash's TTL renewed to ttl_s; one created since still has the TTL its enqueue set, ttl_s give or
# take the slack of shared/job_store.renew_before_ms), refill ('1': move a held job in, as a
# fair lane's write-back does, or one after an entry round robin moved in; '': a plain lane's,
# which then never looks at the fair hash: workers/partition/partition.Partition.refills),
# now_ms, streamed ('1': generations, whose results keep what they ran to on a record a cancel
# ended, see below; '': other results), n, then n job ids whose views were built without
# `created` (an entry that was no job, UndecodableEntry, whose stamp was only its read): FINISH
# puts the `created` and `total_ms` of their hashes in them (from the HMGET it makes anyway),
# owes the events of those whose hashes hold a `webhook` (the unreadable payload named none; the
# writer then declares the owed set), and returns both; then per job a record:
#   entry_id, job_id, reply_channel, view, status, write_id, attempt, webhook, nfields, field,
#   value, ...
# status '' means only acknowledge (job already terminal, cancelled or gone; write_id and attempt
# are then ''); webhook '1' for a job with one: its result, written, puts it on the lane's owed
# set (one ZADD and EXPIRE per call, none for a call without such jobs), which the writer takes
# it off once its event is handed over; `attempt` is this run's entry for the job's history, as
# JSON (shared/job_store.attempt_json, the twin of `attempt` above); a job still `queued` ran
# unmarked (see stream_reader.py) and moves as if from `running`. A result of this consumer's
# that meets a record the API ended while it ran (`cancelled` or `expired`: a cancel, its batch's
# expiry), whether the run saw that (a generation it aborted: a `cancelled` result) or not (a
# cancel after its last status read), is not written and is returned as met, with the end it
# met; a `cancelled` result's fields (what an aborted generation reached: its outputs so far and
# token counts) join a `cancelled` record, never its end (`finished`, `error`) nor `write_id`
# (workers/partition/finish.py: Finish.record), and so do a generation's other results (streamed:
# its client read the tokens), their outputs' finish_reason made `abort`: a failed one's outputs
# are its OUTPUTS_SO_FAR, which its `failed` record, written, does not take; another result is
# dropped. A result whose job's hash is gone (expired or deleted while it ran) is not written and
# is returned as met `cancelled`, as the generate loop reads a job whose hash is gone: it counted
# in no state.
# Per written job two commands (HMGET, HSET; EXPIRE too for a job older than renew_before); per
# micro-batch one SPUBLISH per reply
# channel (a JSON array of the views written for it; the channel is in the partition's slot),
# XACK, XDEL, and the lane's recent list (LPUSH; an LTRIM now and then). In-flight slots live in
# their API keys' slots: the writer frees them beside this script, in the same round trip.
# The written job's attempt history gains the record's `attempt` (read and written in the same
# HMGET and HSET). A job still `running` under another consumer (its `worker`, in the same HMGET;
# a worker's own mark, or none yet, leaves it this one's) was taken over by RECLAIM from this
# one, cut off from Redis past the visibility timeout: its result is not written and its entry,
# the new owner's now, is left out of the XACK and XDEL, so the new owner's result stands and no
# attempt goes on record twice; its id is returned as taken, for the writer to hold its in-flight
# slot again (freed beside this script, before its reply said so). Its write-back of a job the
# API ended (a cancel) while the new owner ran it is left out alike, its `cancelled` record
# unwritten, and not returned as taken (the end freed the slot). Returns {written, taken, met,
# stamps}: job ids, {job id, status} pairs, and {job id, created, webhook} triples ('' for
# none) of the restamped jobs written. Idempotent: a call
# rerun after its reply was lost (a torn connection, a replica WAIT that timed out) changes
# nothing more, and returns and publishes the
# results it wrote (a job whose hash holds the record's `status` and `write_id`, random per
# result) again, so the writer still publishes them and hands their webhooks on, after a replica
# WAIT that now counts them (the rerun writes each `write_id` again); the drained counter counts
# only entries XACK acknowledged.
# A failed generation's outputs so far (its text, finish reason, usage), a field of its result
# that FINISH writes only as the `outputs` of a `cancelled` record it meets (see above).
OUTPUTS_SO_FAR = "outputs_so_far"
FINISH = (
    _PRELUDE
    + _OWE
    + f"""
local SO_FAR = '{OUTPUTS_SO_FAR}'
"""
    + """
-- the jobs whose views take the `created` their hashes hold (ARGV[9] of them, from ARGV[10])
local restamp = {}
for r = 10, 9 + tonumber(ARGV[9]) do restamp[ARGV[r]] = true end
local i, renew_before = 10 + tonumber(ARGV[9]), tonumber(ARGV[5])
local ids, written, fresh, owed, taken_ids, met, stamps = {}, {}, {}, {}, {}, {}, {}
local replies, channels = {}, {}
-- the ends the API gives a running job (a cancel, its Batch API batch's expiry)
local ENDED = {cancelled = true, expired = true}
-- a result's own fields, which a record the API ended does not take: its end (`finished`, and
-- `error`, which a batch's end writes) is the API's, and it holds no result of this worker's
local RESULT_ONLY = {write_id = true, finished = true, error = true}
-- what a run reached (outputs so far, token counts), joined to the record of a job the API ended;
-- a failed generation's outputs are its text so far (SO_FAR). `cut`: a generation that ran on
-- past the cancel, whose outputs' `finish_reason` (the engine's, `length`; a failed one's, none)
-- becomes `abort`, as its final says (RunningJob.settle) and vLLM reports an aborted request.
-- Decoded here, on this rare path only: FINISH's writes pass outputs through unread; outputs
-- that are no JSON object stay as they are (an error here would fail the whole batch)
local function aborted(outputs)
  local ok, decoded = pcall(cjson.decode, outputs)
  if not ok or type(decoded) ~= 'table' then return outputs end
  decoded.finish_reason = 'abort'
  return cjson.encode(decoded)
end
local function ran_to(jk, first, last, cut)
  local kept = {}
  for f = first, last, 2 do
    local name, value = ARGV[f], ARGV[f + 1]
    if name == SO_FAR then name = 'outputs' end
    if not RESULT_ONLY[name] then
      if cut and name == 'outputs' then value = aborted(value) end
      table.insert(kept, name); table.insert(kept, value)
    end
  end
  if #kept > 0 then redis.call('HSET', jk, unpack(kept)) end
end
-- the field/value pairs a result's record takes: all but a failed generation's text so far,
-- which is for a cancel it meets (ran_to); looked for on that rare path only
local function recorded(status, first, last)
  if status ~= 'failed' then return unpack(ARGV, first, last) end
  local kept = {}
  for f = first, last, 2 do
    if ARGV[f] ~= SO_FAR then table.insert(kept, ARGV[f]); table.insert(kept, ARGV[f + 1]) end
  end
  return unpack(kept)
end
-- `view`, built without `created` (so without `total_ms`), with the hash's `created` (ms) and
-- the total from it to the record's `finished`, at the head of its timings (a JSON string
-- escapes its quotes, so the first `"timings":{` is the key's)
local function stamped(view, created, first, last)
  local _, at = string.find(view, '"timings":{', 1, true)
  if not at then return view end
  local add = '"created":' .. tostring(created / 1000)
  for f = first, last, 2 do
    if ARGV[f] == 'finished' then
      -- never below 0, as job_view's: `finished` is the worker's clock, `created` a producer's
      add = add .. ',"total_ms":' .. tostring(math.max(0, tonumber(ARGV[f + 1]) - created))
    end
  end
  if string.sub(view, at + 1, at + 1) ~= '}' then add = add .. ',' end
  return string.sub(view, 1, at) .. add .. string.sub(view, at + 1)
end
while i <= #ARGV do
  local eid, jid, reply, view, status = ARGV[i], ARGV[i+1], ARGV[i+2], ARGV[i+3], ARGV[i+4]
  local write_id, run, webhook = ARGV[i+5], ARGV[i+6], ARGV[i+7]
  local first, last = i + 9, i + 8 + tonumber(ARGV[i+8]) * 2  -- the record's field/value pairs
  local jk = jobkey(ARGV[3], jid)
  local cur = status == '' and {} or redis.call('HMGET', jk, 'status', 'writes',
                                                'attempt_history', 'write_id', 'created', 'worker',
                                                'webhook')
  -- running under another consumer: taken over (RECLAIM) from this one, which lost Redis past
  -- the visibility timeout; the new owner's result stands, so this one neither writes its
  -- result nor acknowledges the entry the new owner holds. So too once the API ended the job
  -- while the new owner ran it: what the new owner's run reached is the job's record (this
  -- older run's cancelled record overwrote its `started` and `attempts`, and the entry, which
  -- this one acknowledged, was given up unwritten by the new owner, whose touch found it gone);
  -- its slot, which the end freed, is not held again (not taken)
  local other = cur[6] and cur[6] ~= ARGV[4]
  local taken = other and cur[1] == 'running'
  local left = other and (taken or not ALLOWED[cur[1]])
  if taken then table.insert(taken_ids, jid) elseif not left then table.insert(ids, eid) end
  if status ~= '' and not left then
    -- a job handed over by a plain XREADGROUP ran without its hash saying so: through running
    local from = (cur[1] == 'queued' and can('queued', 'running')) and 'running' or cur[1]
    -- this very result, written by a call whose reply was lost (the writer retries it)
    local again = cur[1] == status and cur[4] == write_id
    if can(from, status) then
      redis.call('HSET', jk, 'status', status, 'worker', ARGV[4],
                 'writes', (tonumber(cur[2]) or 0) + 1, 'attempt_history', appended(cur[3], run),
                 recorded(status, first, last))
      if (tonumber(cur[5]) or 0) < renew_before then
        redis.call('EXPIRE', jk, ARGV[2], 'GT')  -- never shorter: see ENQUEUE's ttl
      end
      table.insert(fresh, jid)
      -- a restamped job's webhook is its hash's: its entry's payload, which names it, is unread
      if webhook == '1' or (restamp[jid] and cur[7]) then table.insert(owed, jid) end
      again = true
    elseif again then
      -- this very result, rerun: written again (as it is), so that this call, likely on a
      -- connection of its own, has written it, and a replica WAIT behind it waits for it (WAIT
      -- counts a connection's own writes: one that wrote nothing returned at once)
      redis.call('HSET', jk, 'write_id', write_id)
    elseif ENDED[cur[1]] then
      -- ended through the API while it ran here, whether its run saw that (a `cancelled`
      -- result) or not (a cancel after its last status read): it ended as the API said, which
      -- the reply tells; no write is counted, no reply or webhook sent (the cancel's were). A
      -- run that saw its cancel (a generation aborted) leaves what it reached (outputs so far,
      -- token counts) on the record, whose status, end and attempt the cancel wrote; a result
      -- made for no one once the API had ended the job (an embedding computed after its cancel)
      -- is dropped, as a revoked task's; but a generation's (ARGV[8]), whose tokens its client
      -- read as they came, keeps what it ran to, as an aborted one does, ended by `abort` too;
      -- a failed one its text so far, without its `error`: the cancel ended it, as its final
      -- says (no error), and vLLM tells an aborted request's text so far, no error
      if cur[1] == 'cancelled' and (status == 'cancelled' or ARGV[8] == '1') then
        ran_to(jk, first, last, status ~= 'cancelled')
      end
      table.insert(met, {jid, cur[1]})
    elseif not cur[1] then
      -- its hash gone (expired, deleted) while it ran: nothing to write; it ended as a job
      -- read gone ends, `cancelled` (the generate loop's final says so), for it to count
      table.insert(met, {jid, 'cancelled'})
    end
    if again then
      if restamp[jid] then
        table.insert(stamps, {jid, cur[5] or '', cur[7] or ''})
        if reply ~= '' and cur[5] then view = stamped(view, tonumber(cur[5]), first, last) end
      end
      if reply ~= '' then
        if not replies[reply] then replies[reply] = {}; table.insert(channels, reply) end
        table.insert(replies[reply], view)
      end
      table.insert(written, jid)
    end
  end
  i = last + 1
end
for _, reply in ipairs(channels) do
  redis.call('SPUBLISH', reply, '[' .. table.concat(replies[reply], ',') .. ']')
end
remember(KEYS[1], fresh)
owe(KEYS[1], owed, ARGV[7], ARGV[2])
if #ids > 0 then
  local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  redis.call('XDEL', KEYS[1], unpack(ids))
  -- this second's counter, not declared (see DRAINED): while it is not here, not counted
  local drained = KEYS[1] .. DRAINED .. string.format('%d', math.floor(tonumber(ARGV[7]) / 1000))
  if acked > 0 and here('INCRBY', drained, acked) == acked then
    redis.call('EXPIRE', drained, 120)
  end
end
-- each write-back keeps a fair lane's stream awake
if ARGV[6] == '1' then refill(KEYS[1], ARGV[1], ARGV[3], 1) end
return {written, taken_ids, met, stamps}
"""
)

# KEYS[1]=job key; ARGV: target status, reply channel, message, ttl_s, job id, field, value, ...
# Returns {0, status before}, or {1, status before, withdrawn (0|1: see `withdraw`), model,
# variant}; {0, status, withdrawn, model, variant} for a rerun of a move that wrote `ended_by` (its
# reply lost, the call sent again), which finds its own token: what its first run withdrew, kept
# beside the token (`withdrawn`), so the caller counts that end once. A terminal target puts the job
# on its lane's recent list (the caller frees its in-flight slot, in the API key's slot), and ends
# the attempt of the worker running the job (its `worker` since its `started`) on the job's attempt
# history, as `cancelled`, `expired` or `failed`; a job a fair lane holds back leaves the lane's
# `held` count then (admission counts it against max_length), not when refill later drops its entry,
# and its place (`hseq`) joins its tenant's ENDED set, which POSITION counts off later jobs'. A
# terminal move that writes `ended_by` (JobStore.transition's: the API's cancel, which then hands
# the job's event over) of a job with a webhook puts it on its lane's owed set, scored by its
# `finished`; settle_many's (a batch's items, whose ends no job event reports) does not. A queued
# job's end withdraws its stream entry unless a consumer holds it (`withdraw`).
TRANSITION = (
    _PRELUDE
    + _OWE
    + f"""
local GROUP = '{GROUP}'
"""
    + """
-- A queued job's entry that no consumer has been handed leaves its lane as the job ends: kept,
-- it went on counting toward max_length, other jobs' positions and KEDA's stream length until a
-- worker read it only to skip it, which a pool scaled to zero never did. One in the group's PEL
-- (read, not yet marked running) stays: its worker acknowledges it, as before. Its number joins
-- the lane's WITHDRAWN set, from which POSITION counts it back for the jobs ahead of it (`added`
-- still counts it); numbers below the oldest undelivered entry's correct no position and go (a
-- bound of that entry's number: every number from it on is undelivered or withdrawn), all of
-- them once nothing waits. While a migration has a key elsewhere, the entry stays. True if the
-- entry was withdrawn.
local function withdraw(stream, eid, seq, ttl)
  local ok, pel = pcall(redis.call, 'XPENDING', stream, GROUP, eid, eid, 1)
  if ok and #pel > 0 then return false end
  if here('XDEL', stream, eid) ~= 1 then return false end
  local withdrawn, waiting = stream .. WITHDRAWN, undelivered(stream, GROUP)
  if waiting <= 0 then here('DEL', withdrawn); return true end
  local added = tonumber((here('GET', stream .. ADDED))) or 0
  if not select(2, here('ZADD', withdrawn, seq, seq)) then return true end
  local below = added + 1 - waiting - redis.call('ZCARD', withdrawn)
  redis.call('ZREMRANGEBYSCORE', withdrawn, '-inf', '(' .. below)
  redis.call('EXPIRE', withdrawn, ttl)
  return true
end

local job = redis.call('HMGET', KEYS[1], 'status', 'worker', 'started', 'attempt_history',
                      'stream', 'held', 'webhook', 'seq', 'entry', 'model', 'variant', 'tenant',
                      'hseq', 'ended_by', 'withdrawn')
local cur = job[1]
local args = {'status', ARGV[1]}
for j = 6, #ARGV do table.insert(args, ARGV[j]) end
local token = field(args, 'ended_by')
if not can(cur, ARGV[1]) then
  if token and cur == ARGV[1] and job[14] == token then
    return {0, cur, tonumber(job[15]) or 0, job[10] or '', job[11] or ''}
  end
  return {0, cur or false}
end
if not ALLOWED[ARGV[1]] and job[6] == '1' and job[5] then
  -- ended while its fair lane held it back: no longer counted where admission counts held jobs
  -- (its entry stays in its tenant's list until refill drops it). The set first: neither key is
  -- declared, so a migration that has one elsewhere fails the call here (an outage, the cancel
  -- retried), and an SADD done before such a failure is done again alike; the count taken off
  -- first was taken off again by every retry.
  redis.call('SADD', job[5] .. UNCOUNTED, ARGV[5])
  redis.call('HINCRBY', job[5] .. FAIR, 'held', -1)
  unheld(job[5], {ARGV[5]})  -- no longer the lane's oldest held job
  -- nor one of its tenant's jobs ahead of another in a position, nor, its tenant's last held
  -- one, a turn of that tenant's in every round (its entry's `e:` count goes as refill drops it)
  local tenant = job[12] or 'default'
  local ended = redis.call('HINCRBY', job[5] .. FAIR, 'e:' .. tenant, 1)
  -- and its place, which POSITION counts off the later jobs' (gone as refill pops it; not
  -- here while a migration has the set elsewhere: those jobs count it until it is dropped)
  if job[13] then here('ZADD', job[5] .. ENDED .. tenant, job[13], job[13]) end
  local entries, served = here('LLEN', job[5] .. HELD .. tenant)
  if served and entries <= ended then unweigh(job[5] .. FAIR, tenant) end
  table.insert(args, 'held')  -- the mark workers before the set read (a rolling upgrade)
  table.insert(args, UNCOUNTED_MARK)
end
local withdrawn = 0
if cur == 'queued' and not ALLOWED[ARGV[1]] and job[5] and job[8] and (job[9] or '') ~= ''
   and withdraw(job[5], job[9], job[8], ARGV[4]) then
  withdrawn = 1
end
if token then  -- for a rerun of this call (above)
  table.insert(args, 'withdrawn')
  table.insert(args, withdrawn)
end
if cur == 'running' and not ALLOWED[ARGV[1]] then
  local run = attempt(job[2], job[3], field(args, 'finished'), ARGV[1], field(args, 'error'))
  table.insert(args, 'attempt_history')
  table.insert(args, appended(job[4], run))
end
redis.call('HSET', KEYS[1], unpack(args))
redis.call('EXPIRE', KEYS[1], ARGV[4], 'GT')
if ARGV[2] ~= '' then redis.call('SPUBLISH', ARGV[2], ARGV[3]) end
if not ALLOWED[ARGV[1]] and job[5] then
  remember(job[5], {ARGV[5]})
  if job[7] and field(args, 'ended_by') then
    owe(job[5], {ARGV[5]}, field(args, 'finished'), ARGV[4])
  end
end
return {1, cur, withdrawn, job[10] or '', job[11] or ''}
"""
)

# KEYS[1]=stream, KEYS[2]=its added counter; ARGV: group, the job's seq ('' for a job a fair
# lane holds), its tenant, a held job's `hseq` ('' or none: held before it was kept). Read-only:
# how many entries are still undelivered ahead of the job numbered seq (undelivered = XLEN -
# pending; those added after it are undelivered too while it is, but for those a cancel
# withdrew: the lane's WITHDRAWN set), four commands in one round trip, O(log withdrawn) at most.
# A held job: the undelivered entries plus the held ones deficit round robin serves first, its
# tenant's own ahead of it counted as the fewer of its tenant's other live held jobs and the
# entries ahead of it in its list (its place among the tenant's holds, `hseq`, less those taken
# off the list since, `o:`, and, while the tenant has any, the places of its jobs that ended while
# held, ZCOUNT of its ENDED set: counted until a refill dropped their entries, they put each
# later job behind them): a bound, O(log n) (the ring's weight sum is kept). Counted as its
# tenant's last held job, a job's position grew with each job its tenant held after it.
POSITION = (
    _PRELUDE
    + """
local waiting = undelivered(KEYS[1], ARGV[1])
if ARGV[2] == '' then
  local fair, tenant = KEYS[1] .. FAIR, ARGV[3]
  local h = redis.call('HMGET', fair, 'held', 'w:' .. tenant, 'e:' .. tenant, 'o:' .. tenant)
  local held = (tonumber(h[1]) or 1) - 1
  local entries = redis.call('LLEN', KEYS[1] .. HELD .. tenant)
  local own = math.max(0, entries - (tonumber(h[3]) or 0) - 1)  -- its other jobs still held
  local place = tonumber(ARGV[4])  -- its `hseq`: the entries ahead of it, ended ones too
  if place then
    local taken = tonumber(h[4]) or 0
    local ahead = place - taken - 1
    if (tonumber(h[3]) or 0) > 0 then  -- less those of jobs that ended while held
      ahead = ahead - redis.call('ZCOUNT', KEYS[1] .. ENDED .. tenant, '(' .. taken, '(' .. place)
    end
    own = math.min(own, math.max(0, ahead))
  end
  local weight = tonumber(h[2])
  return math.max(0, waiting) + held_ahead(KEYS[1], spent(weight), weight or 0, held, own)
end
local added = tonumber(redis.call('GET', KEYS[2]) or 0)
local gone = redis.call('ZCOUNT', KEYS[1] .. WITHDRAWN, '(' .. ARGV[2], '+inf')
return math.max(0, waiting - (added - tonumber(ARGV[2]) - gone) - 1)
"""
)

# What a cluster client loads on every node at start (shared/redis_client.preload): these run in
# pipelines, where a cluster client does not load a missing script itself.
# KEYS[1]=a fair lane's stream; ARGV[1]=how many at most. The ids of the jobs it holds back per
# tenant (msgpack, which only a script reads), tenant by tenant in the ring's order, then the
# parked tenants' by their rounds: what the console lists beside the stream's entries, which are
# only the fair window's.
HELD_IDS = (
    f"""
local FAIR_RING, HELD = '{FAIR_RING_SUFFIX}', '{HELD_SUFFIX}'
local PARKED = '{FAIR_PARKED_SUFFIX}'
"""
    + """
local ids, left = {}, tonumber(ARGV[1])
local tenants = redis.call('LRANGE', KEYS[1] .. FAIR_RING, 0, -1)
for _, tenant in ipairs(redis.call('ZRANGE', KEYS[1] .. PARKED, 0, -1)) do
  tenants[#tenants + 1] = tenant
end
for _, tenant in ipairs(tenants) do
  if left <= 0 then break end
  for _, packed in ipairs(redis.call('LRANGE', KEYS[1] .. HELD .. tenant, 0, left - 1)) do
    local entry = cmsgpack.unpack(packed)
    for i = 1, #entry, 2 do
      if entry[i] == 'id' then table.insert(ids, entry[i + 1]) end
    end
    left = left - 1
  end
end
return ids
"""
)

# KEYS[1]=a tenant's held list of a fair lane; ARGV[1]=a job id, ARGV[2], ARGV[3]=the first and
# last index to look at. The job's packed entry as flat fields, else how many entries it looked
# at: a held job is in no stream yet, so the console's page of it showed no inputs while it
# waited.
HELD_ENTRY = """
local rows = redis.call('LRANGE', KEYS[1], ARGV[2], ARGV[3])
for _, packed in ipairs(rows) do
  local entry = cmsgpack.unpack(packed)
  for i = 1, #entry, 2 do
    if entry[i] == 'id' then
      if entry[i + 1] == ARGV[1] then return entry end
      break
    end
  end
end
return #rows
"""

ALL = (
    TAKE,
    MARK_RUNNING,
    ENQUEUE,
    REPLAY_LETTER,
    RECLAIM,
    FINISH,
    TRANSITION,
    POSITION,
    HELD_IDS,
    HELD_ENTRY,
)
