"""The Lua script that appends to an LLM job's token stream (shared/token_stream.py): once,
however often a call is sent. redis-py resends a whole pipeline when its connection drops after
the server ran it, and a plain XADD then appended the tick's text a second time, which every
reader showed twice."""

from __future__ import annotations

# KEYS[1]=a job's token stream, KEYS[2] (optional) its lane stream; ARGV: ttl_s (0: the TTL stays; a
# run's first write sets the result TTL, its final one the shorter token-stream TTL,
# workers/partition/token_writer.py), the attempt (random per run of the job), the number of this
# call's first event in the attempt, the group, lane entry id and consumer that must hold the entry
# (read with KEYS[2]), then per event its field count and field/value pairs. A call whose consumer
# no longer holds the lane entry is refused (0; else 1): another worker took the job over (a reclaim
# while this run was cut off from Redis) or ended it, and this stale run's text, its first write's
# too (no `restart` before it: it is no redelivery), would mix with the new run's, its `final` end
# readers early. Each entry carries `a` (the attempt) and `n` (its number in it): events the
# stream's last entry says this attempt appended already are skipped. A call that continues its
# attempt (first event past 1) on a stream whose last entry is another attempt's is refused too: a
# later run of the job wrote since (this worker's own reclaimer may have taken the entry back). The
# lane stream and the token stream carry the partition's hash tag: one slot on a Cluster.
APPEND = """
if KEYS[2] then
  local row = redis.pcall('XPENDING', KEYS[2], ARGV[4], ARGV[5], ARGV[5], 1)
  if row.err or not row[1] or row[1][2] ~= ARGV[6] then return 0 end
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
local n, i = tonumber(ARGV[3]), 7
local done = 0
if last then
  local a, at
  for j = 1, #last[2], 2 do
    local name = last[2][j]
    if name == 'a' then a = last[2][j + 1] elseif name == 'n' then at = last[2][j + 1] end
  end
  if a == ARGV[2] then done = tonumber(at) elseif n > 1 then return 0 end
end
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  if n > done then
    redis.call('XADD', KEYS[1], '*', 'a', ARGV[2], 'n', n, unpack(ARGV, i + 1, i + count * 2))
  end
  n, i = n + 1, i + 1 + count * 2
end
if ARGV[1] ~= '0' then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return 1
"""

ALL = (APPEND,)
