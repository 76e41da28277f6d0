"""Per-variant counters and latency samples in Redis, in time buckets (shared/stats_window.py), so
every worker (where jobs finish) and every producer (shadow comparisons) contributes to one
picture that canaries and experiment statistics read. Writes are aggregated: one script call
per variant for many jobs (a worker sends a second's worth), never one command per job."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared.codec import as_text, loads
from shared.job_states import UNRUN_ERRORS
from shared.keys import Keys
from shared.rate_limit import RateLimiter
from shared.redis_clock import CLOCK
from shared.stats_window import SAMPLES_PER_BUCKET, WINDOW_SAMPLES, bucket_of

# Samples a window decodes on the event loop (a few ms); more go to a thread (see `window`).
DECODED_ON_THE_LOOP = 2_000
RETENTION_S = 2 * 86_400
# timed; `expired` counts untimed (it never ran), `cancelled` (the client's choice) not at all
COUNTED = ("succeeded", "failed")
# The tenant of shadow copies (producer_api/routes/shadowing.py), no API key's (shared/api_keys
# TENANT). One that expired counts not at all: it waited in the bulk lane behind online work, by
# design, with its primary's deadline, which says nothing of its variant.
SHADOW_TENANT = "~shadow"
Variant = tuple[str, str]  # (model, variant)

# KEYS[1]=counters hash, KEYS[2]=samples list, KEYS[3]=the call's mark; ARGV: ttl, sample cap,
# ms the mark is kept, n, n (field, increment) pairs, m, then m online samples and the bulk ones.
# Adds the increments and keeps the samples while the bucket has room, online ones first: a
# step's p99 is judged on online samples (shared/canary_steps.most_samples), and heavy Batch API
# traffic in the bulk lane filled the cap, so none was. Online ones go to the head and take the
# room of bulk ones, kept at the tail (a bulk one ends in ',1', Sample.encode); the bulk ones
# fill what room is left. A call whose mark is set already is a rerun (the client resends a
# script whose reply was lost) and adds nothing: its jobs were counted twice, samples too, in
# what a canary's steps and an experiment's statistics are judged on. Returns the samples kept.
_RECORD = """
if not redis.call('SET', KEYS[3], 1, 'NX', 'PX', ARGV[3]) then return 0 end
local n = tonumber(ARGV[4])
for i = 5, 4 + n * 2, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
local m, first = tonumber(ARGV[5 + n * 2]), 6 + n * 2
if first > #ARGV then return 0 end
local cap, length = tonumber(ARGV[2]), redis.call('LLEN', KEYS[2])
local online = math.min(m, cap)
while length > cap - online do
  local last = redis.call('LINDEX', KEYS[2], -1)
  if string.sub(last, -2) ~= ',1' then break end
  redis.call('RPOP', KEYS[2])
  length = length - 1
end
online = math.min(online, cap - length)
if online > 0 then redis.call('LPUSH', KEYS[2], unpack(ARGV, first, first + online - 1)) end
local bulk = math.min(#ARGV - first - m + 1, cap - length - online)
if bulk > 0 then redis.call('RPUSH', KEYS[2], unpack(ARGV, first + m, first + m + bulk - 1)) end
redis.call('EXPIRE', KEYS[2], ARGV[1])
return online + bulk
"""

# KEYS[1]=counters hash, KEYS[2]=a page's added hash; ARGV: ttl, the page's ttl, variant, then
# (field, increment) pairs. Adds the increments unless this page's were added to this variant.
_ADD_ONCE = """
if redis.call('HSETNX', KEYS[2], ARGV[3], 1) == 0 then return 0 end
redis.call('EXPIRE', KEYS[2], ARGV[2])
for i = 4, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS: the counters hashes of n buckets, then their samples lists (all in the model's slot);
# ARGV: most samples (0: none, counters only). Sums the counters and returns {flat name/sum
# pairs, samples}; past `most` samples in all, each bucket keeps its proportional share.
_SUM = """
local n, most = #KEYS / 2, tonumber(ARGV[1])
local lengths, total = {}, 0
for b = 1, n do
  lengths[b] = redis.call('LLEN', KEYS[n + b])
  total = total + lengths[b]
end
local share = math.min(1, most / math.max(total, 1))
local sums, names, samples = {}, {}, {}
for b = 1, n do
  local flat = redis.call('HGETALL', KEYS[b])
  for i = 1, #flat, 2 do
    if sums[flat[i]] == nil then sums[flat[i]] = 0; table.insert(names, flat[i]) end
    sums[flat[i]] = sums[flat[i]] + tonumber(flat[i + 1])
  end
  local keep = math.ceil(lengths[b] * share)
  if keep > 0 then
    for _, row in ipairs(redis.call('LRANGE', KEYS[n + b], 0, keep - 1)) do
      table.insert(samples, row)
    end
  end
end
local out = {}
for _, name in ipairs(names) do
  table.insert(out, name)
  table.insert(out, string.format('%.17g', sums[name]))
end
return {out, samples}
"""


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished job: whether it succeeded, its queue wait and its service time (claim to
    result), in milliseconds. An untimed one (an expired job: it never ran) counts as a request
    and an error but keeps no latency, as a dead letter keeps none. `bulk`: it ran from the bulk
    lane (Batch API items, bulk submissions), whose wait behind online work is by design."""

    ok: bool
    queue_ms: float
    service_ms: float
    timed: bool = True
    bulk: bool = False

    @property
    def total_ms(self) -> float:
        return self.queue_ms + self.service_ms

    def encode(self) -> str:
        lane = ",1" if self.bulk else ""  # samples stored before there was a lane read online
        return f"{int(self.ok)},{self.queue_ms:.3f},{self.service_ms:.3f}{lane}"

    @classmethod
    def decode(cls, text: str) -> Sample:
        ok, queue_ms, service_ms, *lane = text.split(",")
        return cls(ok == "1", float(queue_ms), float(service_ms), bulk=lane == ["1"])


@dataclass(slots=True)
class Window:
    """What one variant did over a time window: counters (requests, errors; a shadow's
    shadow_pairs, shadow_answered: those whose two jobs answered, shadow_agreed: of those, the
    agreeing ones, shadow_similarity, shadow_unscored_pairs: those without a similarity,
    shadow_latency_delta_ms, shadow_untimed_pairs: those without a delta, and the pairs with a
    failure by whose, shared/shadow_compare.FAILED) and the latency samples. Buckets written
    before carry shadow_agree and shadow_error_delta, read by nothing now: the first counted
    two failures as an agreement, the second netted the shadow's failures against the
    primary's."""

    counters: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    samples: list[Sample] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return int(self.counters["requests"])

    @property
    def errors(self) -> int:
        return int(self.counters["errors"])

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def sample_of(fields: Mapping[str, str]) -> Sample | None:
    """The sample of a finished job from its hash fields (`status`; `created`, `started` and
    `finished` in ms; `lane`; `tenant`; `error`): untimed if it expired (None for a shadow
    copy) or failed unrun (UNRUN_ERRORS), None unless it succeeded or failed with all three
    stamps otherwise."""
    status = fields.get("status")
    bulk = fields.get("lane") == "bulk"
    if status == "expired":
        if fields.get("tenant") == SHADOW_TENANT:
            return None
        return Sample(False, 0.0, 0.0, timed=False, bulk=bulk)
    if status == "failed" and _error_type(fields.get("error")) in UNRUN_ERRORS:
        return Sample(False, 0.0, 0.0, timed=False, bulk=bulk)
    if status not in COUNTED:
        return None
    try:
        created, started, finished = (int(fields[k]) for k in ("created", "started", "finished"))
    except (KeyError, ValueError):
        return None
    ok = status == "succeeded"
    queue_ms, service_ms = float(max(started - created, 0)), float(max(finished - started, 0))
    return Sample(ok, queue_ms, service_ms, bulk=bulk)


def _error_type(error: str | None) -> str | None:
    """The `type` of a failed job's `error` (JSON), None if it has none."""
    try:
        decoded = loads(error) if error else None
    except ValueError:
        return None
    return decoded.get("type") if isinstance(decoded, dict) else None


def finished_samples(jobs: Iterable[Mapping[str, str]]) -> dict[Variant, list[Sample]]:
    """The samples of finished jobs (their hash fields: model, variant, status, stamps,
    tenant), by (model, variant)."""
    by_variant: dict[Variant, list[Sample]] = defaultdict(list)
    for fields in jobs:
        if (sample := sample_of(fields)) is not None:
            by_variant[(fields["model"], fields["variant"])].append(sample)
    return by_variant


def _counts(samples: list[Sample]) -> dict[str, float]:
    return {"requests": len(samples), "errors": sum(1 for s in samples if not s.ok)}


def _windows(names: list[str], replies: list[Any]) -> dict[str, Window]:
    """The windows of SUM's replies, one per variant in `names`: its counters and samples."""
    windows = {}
    for variant, (flat, rows) in zip(names, replies, strict=True):
        window = Window()
        for name, value in zip(flat[::2], flat[1::2], strict=True):
            window.counters[as_text(name)] = float(value)
        window.samples = [Sample.decode(as_text(row)) for row in rows]
        windows[variant] = window
    return windows


class VariantStats:
    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._record = client.register_script(_RECORD)
        self._sum = client.register_script(_SUM)
        self._add_once = client.register_script(_ADD_ONCE)

    async def record_samples(self, by_variant: Mapping[Variant, list[Sample]]) -> None:
        """Count the samples and keep them: one script call per variant, all sent at once. Not
        pipelined: after NOSCRIPT from one node `run_pipeline` reruns every call, and counts
        added twice stay wrong; a lone call that meets NOSCRIPT loads its script, reruns alone."""
        await asyncio.gather(
            *(
                self._add(model, variant, _counts(samples), samples)
                for (model, variant), samples in by_variant.items()
            )
        )

    async def add_counts(self, model: str, variant: str, counts: Mapping[str, float]) -> None:
        """Add to a variant's counters of the current bucket (shadow comparisons)."""
        await self._add(model, variant, counts, [])

    async def add_counts_once(
        self, model: str, variant: str, counts: Mapping[str, float], page: str, keep_s: int
    ) -> None:
        """Add to a variant's counters of the current bucket unless `page`'s were added to it
        (remembered `keep_s`), in one script: a page of shadow comparisons retried after a
        failure adds only what it had not, never a variant's counts twice."""
        flat = [part for pair in counts.items() for part in pair]
        counters = self._bucket_keys(model, variant, [bucket_of(CLOCK.now())])[0]
        await self._add_once(
            keys=[counters, self.keys.shadow_page_added(model, page)],
            args=[RETENTION_S, keep_s, variant, *flat],
        )

    async def _add(
        self, model: str, variant: str, counts: Mapping[str, float], samples: list[Sample]
    ) -> Any:
        flat = [part for pair in counts.items() for part in pair]
        online = [s.encode() for s in samples if s.timed and not s.bulk]
        bulk = [s.encode() for s in samples if s.timed and s.bulk]
        head = [RETENTION_S, SAMPLES_PER_BUCKET, RateLimiter.RERUN_MS, len(counts), *flat]
        counters, listed = self._bucket_keys(model, variant, [bucket_of(CLOCK.now())])
        mark = f"{counters}:call:{uuid.uuid4().hex[:16]}"  # its bucket's slot
        return await self._record(
            keys=[counters, listed, mark], args=[*head, len(online), *online, *bulk]
        )

    async def window(
        self,
        model: str,
        variants: Iterable[str],
        since_s: float,
        until_s: float | None = None,
        samples: bool = True,
    ) -> dict[str, Window]:
        """Each variant's counters and samples (none without `samples`) over the buckets from
        `since_s` to `until_s` (now): one script call per variant, sent at once, summed in
        Redis. Buckets are whole (the window starts up to BUCKET_S early); past WINDOW_SAMPLES
        samples, each bucket keeps its proportional share, its online ones first. A 6 h window
        (the API's longest, ~2 200 buckets) costs about 25 ms of Redis time per variant."""
        names = list(variants)
        buckets = range(bucket_of(since_s), bucket_of(until_s or CLOCK.now()) + 1)
        most = WINDOW_SAMPLES if samples else 0
        replies = await asyncio.gather(
            *(self._sum(keys=self._bucket_keys(model, v, buckets), args=[most]) for v in names)
        )
        if sum(len(rows) for _, rows in replies) < DECODED_ON_THE_LOOP:
            return _windows(names, replies)
        # 100,000 samples take about 0.2 s to decode: on the event loop, every request the
        # producer served waited for it (a canary's look twice a second, a 6 h experiment)
        return await asyncio.to_thread(_windows, names, replies)

    def _bucket_keys(self, model: str, variant: str, buckets: Iterable[int]) -> list[str]:
        """The counters hashes of `buckets`, then their samples lists: the keys a script over
        them declares (one slot: both prefixes carry the model's tag)."""
        return [
            f"{prefix}{bucket}"
            for prefix in (
                self.keys.variant_stats(model, variant),
                self.keys.variant_samples(model, variant),
            )
            for bucket in buckets
        ]
