"""The Lua script that appends to an LLM job's token stream (shared/token_stream.py): once,
however often a call is sent. redis-py resends a whole pipeline when its connection drops after
the server ran it, and a plain XADD then appended the tick's text a second time, which every
reader showed twice."""

from __future__ import annotations

from shared.job_states import lua_transition_table

# KEYS[1]=a job's token stream, KEYS[2] the job's hash, KEYS[3] (optional) its lane stream; ARGV:
# ttl_s and how it is set ('': always, a run's first write the result TTL, its final one the
# shorter token-stream TTL, workers/partition/token_writer.py; 'NX': only on a stream this call
# made, the result TTL of a run's other writes, which recreate a stream evicted or lost in a
# failover: it lived for ever; no EXPIRE for the others, every tick), the attempt (random per
# run of the job), the number of this call's first event in the attempt, the group, lane entry
# id and consumer that must hold the entry (read with KEYS[3]), then per event its field count
# and field/value pairs, `kind` first
# (TokenEvent.encode). A call whose consumer no longer holds the lane entry is refused (0; else
# 1): another worker took the job over (a reclaim while this run was cut off from Redis) or ended
# it, and this stale run's text, its first write's too (no `restart` before it: it is no
# redelivery), would mix with the new run's, its `final` end readers early. Each entry carries `a`
# (the attempt) and `n` (its number in it): events the stream's last entry says this attempt
# appended already are skipped. A call that continues its attempt (first event past 1) on a stream
# whose last entry is another attempt's is refused too: a later run of the job wrote since (this
# worker's own reclaimer may have taken the entry back). A call with a final reads the job's
# status (the loop appends finals after FINISH now, which wrote the record; this keeps a final
# from contradicting a record an older worker, which appended its final first, had not yet
# written: a cancel in the very step that ended its generation made the `succeeded` final
# contradict the `cancelled` record). The final then says what the record holds: the job's
# status and `abort`, as a run that saw the cancel writes it
# (workers/generation/generate_job.py: RunningJob.final_event), and the call returns that status
# (a resent call too), for the loop to end the run as it. A final appended to an ended job's
# stream also leaves its id in the job's hash (FINAL_EVENT), which outlives the stream: once the
# stream expired, a reader resuming after that id is still told that nothing follows
# (producer_api/events/serving.py), where it got the job's whole text again. Only a terminal
# hash gets it: no hash is made for a job whose hash is gone (it would never expire), and a job
# not ended yet may end otherwise. The three keys carry the partition's hash tag, the job id's
# first digits: one slot on a Cluster.
FINAL_EVENT = "final_event"
APPEND = (
    lua_transition_table()
    + f"""
local FINAL_EVENT = '{FINAL_EVENT}'
"""
    + """
-- The fields of the final event at ARGV[from..to] as a record that ended `status` holds them.
local function ended_final(from, to, status)
  local fields = {}
  for j = from, to, 2 do
    local name = ARGV[j]
    if name ~= 'status' and name ~= 'finish_reason' and (name ~= 'error' or status == 'failed') then
      table.insert(fields, name)
      table.insert(fields, ARGV[j + 1])
    end
  end
  table.insert(fields, 'status')
  table.insert(fields, status)
  table.insert(fields, 'finish_reason')
  table.insert(fields, 'abort')
  return fields
end

-- The terminal status the job's hash holds (nil: none, or no hash), and that status again if
-- the final at ARGV[from..to] says another.
local function ended_as(from, to)
  local cur = redis.call('HGET', KEYS[2], 'status')
  if not cur or ALLOWED[cur] then return nil, nil end
  for j = from, to, 2 do
    if ARGV[j] == 'status' and ARGV[j + 1] == cur then return cur, nil end
  end
  return cur, cur
end

if KEYS[3] then
  local row = redis.pcall('XPENDING', KEYS[3], ARGV[5], ARGV[6], ARGV[6], 1)
  if row.err or not row[1] or row[1][2] ~= ARGV[7] then return 0 end
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
local n, i = tonumber(ARGV[4]), 8
local done, ended = 0, nil
if last then
  local a, at
  for j = 1, #last[2], 2 do
    local name = last[2][j]
    if name == 'a' then a = last[2][j + 1] elseif name == 'n' then at = last[2][j + 1] end
  end
  if a == ARGV[3] then done = tonumber(at) elseif n > 1 then return 0 end
end
while i <= #ARGV do
  local from, to = i + 1, i + tonumber(ARGV[i]) * 2
  local final, terminal = ARGV[from + 1] == 'final', nil
  if final then terminal, ended = ended_as(from, to) end
  if n > done then
    local id
    if final and ended then
      local fields = ended_final(from, to, ended)
      id = redis.call('XADD', KEYS[1], '*', 'a', ARGV[3], 'n', n, unpack(fields))
    else
      id = redis.call('XADD', KEYS[1], '*', 'a', ARGV[3], 'n', n, unpack(ARGV, from, to))
    end
    if terminal then redis.call('HSET', KEYS[2], FINAL_EVENT, id) end
  end
  n, i = n + 1, to + 1
end
if ARGV[2] == '' or not last then  -- NX: only a stream this call made (none before it)
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return ended or 1
"""
)

ALL = (APPEND,)
