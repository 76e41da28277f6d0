"""The one place that names Redis keys, so producer, workers and tooling agree on them.

Keys are named for a Redis Cluster (docs/redis-cluster.md, "Keys and slots"): every key a script
or a transaction touches together carries the same hash tag (`{...}`), so it lands in one slot.
- A partition's keys (its lanes' streams and their counters, fair-lane lists, DLQ, job hashes,
  token streams, reply channels and token-hub wake streams) carry the partition's tag: four hex
  digits of a hash of `model:variant`. A job id starts with them, so the job's hash is found
  from its id alone (`GET /v1/jobs/{id}` stays one round trip) and the scripts that move a job
  with its entry (ENQUEUE, TAKE, FINISH, RECLAIM) touch one slot.
- An API key's per-request keys (rate bucket, in-flight set and its rescan marker) carry the
  key id's tag, idempotency claims their tenant's: tenants spread over the masters.
- A model's experiment counters and samples carry the model's tag.
- A batch's keys carry the batch id's tag.
- The control plane (API key records, routes, canaries, shadow pairs, workers and their
  measured costs, the traffic leader lock, the active batches index) shares one tag, `{ctl}`:
  it is small and changes rarely, and its transactions span several of its keys.
Nothing spans slots: no script, no MULTI, no multi-key read. One server is a cluster of one."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

GROUP = "workers"
TAG_LEN = 4  # hex digits of a partition's tag, and so the first characters of its job ids
CONTROL = "{ctl}"
# Keys of a fair lane, named after its stream (docs/architecture.md, "Fair queuing"): a hash of
# counters (`held`, `w:<tenant>` weight, `d:<tenant>` deficit, `e:<tenant>` entries of
# jobs that ended while held, `p:<tenant>` the round a tenant was parked in, `n:<tenant>` and
# `o:<tenant>` the entries its list took in and gave up since it last emptied, `wsum` of the
# weights, `round` and `lr` the ring's round and its turns left, `due` the soonest parked
# tenant's round), the round-robin list of tenants with held jobs, the tenants parked until
# their round (a sorted set: light tenants, whose turns between would only add credit), and one
# list of held entries per tenant (suffix + tenant).
ADDED_SUFFIX = ":added"
RECENT_SUFFIX = ":recent"
RECENT_KEPT = 1_000  # what the console may list of a lane
RECENT_SLACK = 1_000  # how far past that a lane's list grows before it is trimmed back
FAIR_SUFFIX = ":fair"
FAIR_RING_SUFFIX = ":fair:ring"
FAIR_PARKED_SUFFIX = ":fair:parked"
HELD_SUFFIX = ":held:"
# The places (`hseq`) in a tenant's held list of its jobs that ended while held (a sorted set,
# each scored by itself; suffix + tenant): POSITION counts those ahead of a held job off its
# place, where each counted until a refill dropped its entry. Refill takes off the places it
# pops, a sweep drops them all with the entries, and the last place goes with the list's last
# entry.
FAIR_ENDED_SUFFIX = ":fair:ended:"
# The ids of jobs that ended while the lane held them (a set): they left the `held` count then,
# and refill, dropping their entries later, must not count them off again. Kept with the lane,
# not in the job's hash, which may have expired by then.
UNCOUNTED_SUFFIX = ":fair:uncounted"
# The ids of the jobs a fair lane holds, each scored by its submit (`enq`, ms): the oldest held
# job in O(log n) (shared/partition_stats.py's OLDEST), where reading each tenant's list was
# O(tenants) on every stats read.
FAIR_SINCE_SUFFIX = ":fair:since"
# The numbers (`seq`) of entries a cancel withdrew from a lane before any consumer was handed
# them (a sorted set, each scored by itself): POSITION counts those behind a job back, which the
# lane's `added` counter still counts; TRANSITION trims the ones no queued job stands ahead of.
WITHDRAWN_SUFFIX = ":withdrawn"
# Left on the key of an ENQUEUE call's first job when the call refused it and wrote a later job:
# how a rerun of the call (its reply lost) is told from a first run, with one EXISTS per call.
# It outlives any retry of the call (a few backoffs through a failover).
REFUSED_SUFFIX = ":refused"
REFUSED_TTL_S = 300
# Ids of a lane's jobs that ended owing their webhook event (a sorted set, by the end's ms): the
# script that ends such a job adds it, whoever hands the event to the broker removes it, and the
# reclaimer re-sends what stays owed (docs/architecture.md, "Webhooks").
WEBHOOKS_OWED_SUFFIX = ":webhooks-owed"
# Entries a lane finished in one wall-clock second (+ the second): FINISH names the key itself
# rather than declare it, as it does not exist at a second's first write-back, and a declared key
# that exists nowhere held every write-back back for the whole of a migration of its slot.
DRAINED_SUFFIX = ":drained:"


def partition_tag(model: str, variant: str) -> str:
    """The hash tag of a partition's keys (without braces): stable across processes, so every
    producer and worker names the same slot."""
    digest = hashlib.blake2s(f"{model}:{variant}".encode(), digest_size=TAG_LEN // 2)
    return digest.hexdigest()


def new_job_id(model: str, variant: str) -> str:
    """32 hex digits, the first TAG_LEN the partition's tag."""
    return partition_tag(model, variant) + os.urandom(16).hex()[TAG_LEN:]


def replay_job_id(model: str, variant: str, dead_job_id: str, dlq_id: str) -> str:
    """The job id a dead letter is replayed as: the same for every replay of that letter, so
    two replays of it (two operators, a retried command, a replay that died before it removed
    the letter) enqueue one job between them; ENQUEUE leaves a job whose hash exists alone, and
    a fair lane's refill moves a held job in once, however many held entries name it (a second
    replay after the first's held hash expired held it again)."""
    digest = hashlib.blake2s(f"{dead_job_id}:{dlq_id}".encode(), digest_size=16).hexdigest()
    return partition_tag(model, variant) + digest[TAG_LEN:]


def job_tag(job_id: str) -> str:
    """The partition tag a job id carries (any string names some slot: an unknown id simply
    finds no hash)."""
    return job_id[:TAG_LEN]


def _in_slot(job_id: str) -> str:
    """`{tag}rest`: the job id with its tag braced. LUA_JOB_KEY builds the same inside scripts."""
    return f"{{{job_tag(job_id)}}}{job_id[TAG_LEN:]}"


# The Lua twin of Keys.job, for scripts that find job hashes from the ids in stream entries.
LUA_JOB_KEY = f"""
local function jobkey(prefix, jid)
  return prefix .. '{{' .. string.sub(jid, 1, {TAG_LEN}) .. '}}' .. string.sub(jid, {TAG_LEN + 1})
end
"""


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under a configurable prefix (default `cv:`); docs/architecture.md's data plane
    table says what each holds and who writes it."""

    prefix: str = "cv:"

    @staticmethod
    def tag(model: str, variant: str) -> str:
        """A partition's hash tag, braced."""
        return f"{{{partition_tag(model, variant)}}}"

    def queue(self, model: str, variant: str) -> str:
        return f"{self.prefix}q:{self.tag(model, variant)}:{model}:{variant}"

    def bulk_queue(self, model: str, variant: str) -> str:
        return f"{self.queue(model, variant)}:bulk"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{_in_slot(job_id)}"

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}job:"

    def tokens(self, job_id: str) -> str:
        return f"{self.token_prefix}{_in_slot(job_id)}"

    @property
    def token_prefix(self) -> str:
        """What a script puts before a job's slotted id to name its token stream."""
        return f"{self.prefix}tok:"

    def reply(self, producer: str, tag: str) -> str:
        """The sharded pub/sub channel on which workers tell `producer` that jobs of the
        partition tagged `tag` ended: SPUBLISHed by the scripts that end them, in their slot."""
        return f"{self.prefix}reply:{{{tag}}}:{producer}"

    def token_hub_wake(self, producer: str, tag: str) -> str:
        """A tiny stream a producer's token hub for one partition tag also reads, so a new
        listener can wake it (one blocking XREAD reads one slot's streams)."""
        return f"{self.prefix}hub:{{{tag}}}:{producer}"

    def drained(self, stream: str, second: int) -> str:
        """Entries a partition finished in one wall-clock second (drain rate for Retry-After)."""
        return f"{stream}{DRAINED_SUFFIX}{second}"

    def added(self, stream: str) -> str:
        """Entries ever added to a lane (counter, grown by ENQUEUE and by a fair lane's refill as
        entries join the stream): a queued job's `seq` against it gives the job's queue position
        in O(1) (shared/queue_position.py)."""
        return f"{stream}{ADDED_SUFFIX}"

    def recent(self, stream: str) -> str:
        """Ids of a lane's jobs that ended there, newest first (list, LPUSHed by the scripts
        that end jobs; trimmed back to RECENT_KEPT once RECENT_SLACK past it): what the console
        lists jobs from (the first RECENT_KEPT at most), without a SCAN of the keyspace."""
        return f"{stream}{RECENT_SUFFIX}"

    def webhooks_owed(self, stream: str) -> str:
        """Jobs of a lane whose webhook event may not have reached the broker yet (sorted set:
        job id by the ms it ended), so that one lost with its worker is sent all the same."""
        return f"{stream}{WEBHOOKS_OWED_SUFFIX}"

    def webhook_leases(self, stream: str) -> str:
        """Which reclaimer holds each overdue id of a lane's owed set, until when (hash: id ->
        "<reader> <until ms>"), so that one reclaimer re-sends each event."""
        return f"{stream}{WEBHOOKS_OWED_SUFFIX}:leases"

    def fair(self, stream: str) -> str:
        """A fair lane's counters (hash: held, per-tenant weight and deficit)."""
        return f"{stream}{FAIR_SUFFIX}"

    def fair_ring(self, stream: str) -> str:
        """Tenants of a fair lane with held jobs, in round-robin order (list)."""
        return f"{stream}{FAIR_RING_SUFFIX}"

    def fair_parked(self, stream: str) -> str:
        """Tenants of a fair lane parked out of its ring, each scored by the round of its next
        turn that moves a job (sorted set)."""
        return f"{stream}{FAIR_PARKED_SUFFIX}"

    def held(self, stream: str, tenant: str) -> str:
        """One tenant's jobs held back from a fair lane's stream, oldest first (list of packed
        entries)."""
        return f"{stream}{HELD_SUFFIX}{tenant}"

    def service_cost(self, model: str, variant: str) -> str:
        """One replica's measured cost of a partition's work (hash: seconds per job or token,
        tokens per job; shared/backlog.py), what backlog seconds divide by."""
        return f"{self.prefix}{CONTROL}cost:{model}:{variant}"

    def dlq(self, model: str, variant: str) -> str:
        return f"{self.prefix}dlq:{self.tag(model, variant)}:{model}:{variant}"

    def idempotency(self, tenant: str, key: str) -> str:
        """One idempotency key's claim (tagged by tenant: a tenant's claims share a slot)."""
        return f"{self.prefix}idem:{{{tenant}}}:{key}"

    def routes(self, model: str) -> str:
        """A model's live routes (hash: `doc` JSON, `version`); see shared/route_store.py."""
        return f"{self.prefix}{CONTROL}routes:{model}"

    def routes_log(self, model: str) -> str:
        """Every change of a model's routes, oldest first (list of JSON: who, when, old, new)."""
        return f"{self.prefix}{CONTROL}routes:{model}:log"

    @property
    def routes_version(self) -> str:
        """Bumped on every routes change of any model: what producers poll (one GET). Not
        `routes:version`: that is the routes of a model named `version`."""
        return f"{self.prefix}{CONTROL}routes-version"

    def variant_stats(self, model: str, variant: str) -> str:
        """Prefix of one variant's counters: + a time bucket, a hash (shared/variant_stats.py)."""
        return f"{self.prefix}vstats:{{{model}}}:{variant}:"

    def variant_samples(self, model: str, variant: str) -> str:
        """Prefix of one variant's latency samples: + a time bucket, a capped list."""
        return f"{self.prefix}vlat:{{{model}}}:{variant}:"

    def shadow_pairs(self, model: str) -> str:
        """Primary/shadow job pairs not yet compared (sorted set by submit ms)."""
        return f"{self.prefix}{CONTROL}shadow:{model}:pending"

    def shadow_claims(self, model: str) -> str:
        """Pairs a look is comparing (sorted set by claim ms), in the pending set's slot."""
        return f"{self.shadow_pairs(model)}:claimed"

    def shadow_result(self, job_id: str) -> str:
        """The comparison of a primary job with its shadow copy (hash, result TTL)."""
        return f"{self.prefix}{CONTROL}shadow:{job_id}"

    def shadow_page(self, page: str) -> str:
        """A compared page's counts per shadow variant until all are added (hash, result TTL)."""
        return f"{self.prefix}{CONTROL}shadowpage:{page}"

    def shadow_page_added(self, model: str, page: str) -> str:
        """The shadow variants a page's counts were added to (hash), in the counters' slot."""
        return f"{self.prefix}vpage:{{{model}}}:{page}"

    def canary(self, model: str) -> str:
        """A model's canary rollout (hash: `doc` JSON of its state)."""
        return f"{self.prefix}{CONTROL}canary:{model}"

    def canary_lock(self, model: str) -> str:
        """Held while one producer decides, starts or aborts a model's canary (string, a token)."""
        return f"{self.prefix}{CONTROL}canary:{model}:lock"

    def canary_events(self, model: str) -> str:
        """Every decision of a model's latest canary, oldest first (list of JSON): its start
        drops the last canary's."""
        return f"{self.prefix}{CONTROL}canary:{model}:events"

    @property
    def lettered(self) -> str:
        """Partitions (`model:variant`) that have dead-lettered a job (set): the console and
        `conveyor dlq partitions` list their letters, a model or variant taken out of the model
        repository included, without a SCAN of the keyspace."""
        return f"{self.prefix}{CONTROL}dlq-partitions"

    @property
    def canaries_active(self) -> str:
        """Models with a canary in progress, or ended owing a webhook (set)."""
        return f"{self.prefix}{CONTROL}canaries"

    @property
    def traffic_leader(self) -> str:
        """The lock one producer holds to run canaries and shadow comparisons (string, PX)."""
        return f"{self.prefix}{CONTROL}leader:traffic"

    def autoscale_leader(self, model: str, variant: str) -> str:
        """The lease one `conveyor autoscale` holds to scale a pool (string, PX): two of them
        on one pool each started up to its max."""
        return f"{self.prefix}{CONTROL}autoscale:{model}:{variant}"

    def batch(self, batch_id: str) -> str:
        """A batch's metadata, counters and webhook log (hash)."""
        return f"{self.prefix}batch:{{{batch_id}}}"

    def file(self, file_id: str) -> str:
        """An uploaded Batch API input file: its bytes and who owns it (hash, its own slot)."""
        return f"{self.prefix}file:{{{file_id}}}"

    def batch_items(self, batch_id: str) -> str:
        """Job ids of a batch's enqueued lines, in line order (list)."""
        return f"{self.prefix}batch:{{{batch_id}}}:items"

    def batch_open(self, batch_id: str, model: str, variant: str) -> str:
        """Job ids of a batch's items in one partition, in stream order (list, written at
        create and as held items are fed): tagged with the PARTITION's tag, so the script that
        counts finished items reads their job hashes in its own slot; the batch hash holds how
        far it has counted."""
        return f"{self.prefix}batch:{self.tag(model, variant)}:open:{batch_id}:{model}:{variant}"

    def batch_rejected(self, batch_id: str) -> str:
        """Lines refused at submit (invalid, or their partition was full), in line order."""
        return f"{self.prefix}batch:{{{batch_id}}}:rejected"

    def webhook_hold(self, origin: str) -> str:
        """A webhook receiver (`scheme://host:port`) that ran out a delivery's whole timeout:
        set with a TTL, its deliveries wait out the hold instead of trying it (string)."""
        return f"{self.prefix}{CONTROL}webhook-hold:{origin}"

    def webhook_claim(self, task_id: str, retries: int) -> str:
        """The claim of one attempt of a webhook delivery (its Celery task id, its retries count):
        a copy kombu restores while the first still holds it finds it taken (string, TTL)."""
        return f"{self.prefix}{CONTROL}webhook-claim:{task_id}:{retries}"

    def batches_of(self, tenant: str) -> str:
        """A tenant's batches, scored by their creation time in ms (sorted set), for listing."""
        return f"{self.prefix}{CONTROL}batches:tenant:{tenant}"

    def batches_unlisted_of(self, tenant: str) -> str:
        """Batches dropped from `batches_of` once their keys expired, scored by their creation
        ms (sorted set; a hash before, which shared/tenant_index.py converts), so a page after
        one of them still finds its place."""
        return f"{self.prefix}{CONTROL}batches:unlisted:{tenant}"

    def files_unlisted_of(self, tenant: str) -> str:
        """As `batches_unlisted_of`, for `files_of`."""
        return f"{self.prefix}{CONTROL}files:unlisted:{tenant}"

    def files_of(self, tenant: str) -> str:
        """A tenant's uploaded files, scored by their upload time in ms (sorted set), for
        listing."""
        return f"{self.prefix}{CONTROL}files:tenant:{tenant}"

    def file_budget_of(self, tenant: str) -> tuple[str, str]:
        """What a tenant's files hold against its budget: file id -> bytes with their `total`
        (hash), and when each expires (sorted set, ms); in its index's slot (a tenant name holds
        no `:`, so no other tenant's index is named alike)."""
        index = self.files_of(tenant)
        return f"{index}:bytes", f"{index}:expiring"

    @property
    def batches_active(self) -> str:
        """Batches not yet finished, scored by their expiry time in ms (sorted set)."""
        return f"{self.prefix}{CONTROL}batches:active"

    @property
    def batches_ended(self) -> str:
        """Batches that ended lately, scored by when (ms; sorted set): what the console shows
        of a batch that ran and ended between two of its looks."""
        return f"{self.prefix}{CONTROL}batches:ended"

    def worker(self, name: str) -> str:
        """One worker's latest heartbeat (hash with a TTL; shared/worker_registry.py)."""
        return f"{self.prefix}{CONTROL}worker:{name}"

    @property
    def workers(self) -> str:
        """Names of workers that sent a heartbeat, scored by its time in ms (sorted set)."""
        return f"{self.prefix}{CONTROL}workers"

    def api_key(self, key_id: str) -> str:
        """One API key's record (hash): sha-256 of the key, tenant, scopes, limits; no key."""
        return f"{self.prefix}{CONTROL}apikey:{key_id}"

    @property
    def api_key_index(self) -> str:
        """Ids of every API key (set), for `conveyor keys list`."""
        return f"{self.prefix}{CONTROL}apikeys"

    def console_session(self, nonce: str) -> str:
        """A console session still open (string, TTL the idle timeout, renewed by each use);
        gone once it lapses or is logged out of, so a copy of its cookie opens nothing."""
        return f"{self.prefix}console:session:{nonce}"

    def console_login_failures(self, bucket: str) -> str:
        """Console logins from one client address in the current minute (string, TTL 60 s),
        less those whose key was found (producer_api/console/login_throttle.py)."""
        return f"{self.prefix}console:login-failures:{bucket}"

    def rate_bucket(self, key_id: str) -> str:
        """Token bucket of one API key (hash: tokens, ms timestamp), shared by all producers."""
        return f"{self.prefix}rl:{{{key_id}}}"

    def rate_verdict(self, key_id: str, request_id: str) -> str:
        """One take of the key's bucket: its verdict, kept so a rerun is not charged again."""
        return f"{self.rate_bucket(key_id)}:req:{request_id}"

    def in_flight(self, key_id: str) -> str:
        """Jobs of one API key not yet seen terminal (sorted set: job id by admission ms)."""
        return f"{self.prefix}inflight:{{{key_id}}}"

    def in_flight_scan(self, key_id: str) -> str:
        """Marker that limits full rescans of an at-cap in-flight set to one per second."""
        return f"{self.prefix}inflight:{{{key_id}}}:scan"

    def open_streams(self, key_id: str) -> str:
        """Job-event streams one API key holds open (sorted set: stream id by the ms it was
        last seen alive)."""
        return f"{self.prefix}streams:{{{key_id}}}"

    def batch_held(self, batch_id: str, model: str, variant: str) -> str:
        """A batch's items in one partition that its bulk lane had no room for at create, in
        line order (list), in the partition's slot: fed into the lane as room frees."""
        return f"{self.prefix}batch:{self.tag(model, variant)}:held:{batch_id}:{model}:{variant}"
