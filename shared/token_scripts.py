"""The Lua script that appends to an LLM job's token stream (shared/token_stream.py): once,
however often a call is sent. redis-py resends a whole pipeline when its connection drops after
the server ran it, and a plain XADD then appended the tick's text a second time, which every
reader showed twice."""

from __future__ import annotations

# KEYS[1]=a job's token stream; ARGV: ttl_s (0: the TTL stays), the attempt (random per run of
# the job), the number of this call's first event in the attempt, then per event its field count
# and field/value pairs. Each entry carries `a` (the attempt) and `n` (its number in it): events
# the stream's last entry says this attempt appended already are skipped.
APPEND = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
local done = 0
if last then
  local a, n
  for i = 1, #last[2], 2 do
    local name = last[2][i]
    if name == 'a' then a = last[2][i + 1] elseif name == 'n' then n = last[2][i + 1] end
  end
  if a == ARGV[2] then done = tonumber(n) end
end
local n, i = tonumber(ARGV[3]), 4
while i <= #ARGV do
  local count = tonumber(ARGV[i])
  if n > done then
    redis.call('XADD', KEYS[1], '*', 'a', ARGV[2], 'n', n, unpack(ARGV, i + 1, i + count * 2))
  end
  n, i = n + 1, i + 1 + count * 2
end
if ARGV[1] ~= '0' then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
"""

ALL = (APPEND,)
