"""The one place that names Redis keys, so producer, workers and tooling agree on them."""

from __future__ import annotations

from dataclasses import dataclass

GROUP = "workers"
# Keys of a fair lane, named after its stream (docs/architecture.md, "Fair queuing"): a hash of
# counters (`held`, `window`, `w:<tenant>` weight, `d:<tenant>` deficit), the round-robin list of
# tenants with held jobs, and one list of held entries per tenant (suffix + tenant).
ADDED_SUFFIX = ":added"
FAIR_SUFFIX = ":fair"
FAIR_RING_SUFFIX = ":fair:ring"
HELD_SUFFIX = ":held:"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under a configurable prefix (default `cv:`); docs/architecture.md's data plane
    table says what each holds and who writes it."""

    prefix: str = "cv:"

    def queue(self, model: str, variant: str) -> str:
        return f"{self.prefix}q:{model}:{variant}"

    def bulk_queue(self, model: str, variant: str) -> str:
        return f"{self.prefix}q:{model}:{variant}:bulk"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    @property
    def job_prefix(self) -> str:
        return f"{self.prefix}job:"

    def tokens(self, job_id: str) -> str:
        return f"{self.prefix}tok:{job_id}"

    def reply(self, producer: str) -> str:
        return f"{self.prefix}reply:{producer}"

    def token_hub_wake(self, producer: str) -> str:
        """A tiny stream a producer's token hub also reads, so a new listener can wake it."""
        return f"{self.prefix}hub:{producer}"

    def drained(self, stream: str, second: int) -> str:
        """Entries a partition finished in one wall-clock second (drain rate for Retry-After)."""
        return f"{stream}:drained:{second}"

    def added(self, stream: str) -> str:
        """Entries ever added to a lane (counter, INCR by ENQUEUE only): a queued job's `seq`
        against it gives the job's queue position in O(1) (shared/queue_position.py)."""
        return f"{stream}{ADDED_SUFFIX}"

    def fair(self, stream: str) -> str:
        """A fair lane's counters (hash: held, window, per-tenant weight and deficit)."""
        return f"{stream}{FAIR_SUFFIX}"

    def fair_ring(self, stream: str) -> str:
        """Tenants of a fair lane with held jobs, in round-robin order (list)."""
        return f"{stream}{FAIR_RING_SUFFIX}"

    def held(self, stream: str, tenant: str) -> str:
        """One tenant's jobs held back from a fair lane's stream, oldest first (list of packed
        entries)."""
        return f"{stream}{HELD_SUFFIX}{tenant}"

    def service_cost(self, model: str, variant: str) -> str:
        """One replica's measured cost of a partition's work (hash: seconds per job or token,
        tokens per job; shared/backlog.py), what backlog seconds divide by."""
        return f"{self.prefix}cost:{model}:{variant}"

    def dlq(self, model: str, variant: str) -> str:
        return f"{self.prefix}dlq:{model}:{variant}"

    def idempotency(self, tenant: str, key: str) -> str:
        return f"{self.prefix}idem:{tenant}:{key}"

    def routes(self, model: str) -> str:
        """A model's live routes (hash: `doc` JSON, `version`); see shared/route_store.py."""
        return f"{self.prefix}routes:{model}"

    def routes_log(self, model: str) -> str:
        """Every change of a model's routes, oldest first (list of JSON: who, when, old, new)."""
        return f"{self.prefix}routes:{model}:log"

    @property
    def routes_version(self) -> str:
        """Bumped on every routes change of any model: what producers poll (one GET)."""
        return f"{self.prefix}routes:version"

    def variant_stats(self, model: str, variant: str) -> str:
        """Prefix of one variant's counters: + a time bucket, a hash (shared/variant_stats.py)."""
        return f"{self.prefix}vstats:{model}:{variant}:"

    def variant_samples(self, model: str, variant: str) -> str:
        """Prefix of one variant's latency samples: + a time bucket, a capped list."""
        return f"{self.prefix}vlat:{model}:{variant}:"

    def shadow_pairs(self, model: str) -> str:
        """Primary/shadow job pairs not yet compared (sorted set by submit ms)."""
        return f"{self.prefix}shadow:{model}:pending"

    def shadow_result(self, job_id: str) -> str:
        """The comparison of a primary job with its shadow copy (hash, result TTL)."""
        return f"{self.prefix}shadow:{job_id}"

    def canary(self, model: str) -> str:
        """A model's canary rollout (hash: `doc` JSON of its state)."""
        return f"{self.prefix}canary:{model}"

    def canary_events(self, model: str) -> str:
        """Every decision of a model's canaries, oldest first (list of JSON)."""
        return f"{self.prefix}canary:{model}:events"

    @property
    def canaries_active(self) -> str:
        """Models with a canary in progress (set)."""
        return f"{self.prefix}canaries"

    @property
    def traffic_leader(self) -> str:
        """The lock one producer holds to run canaries and shadow comparisons (string, PX)."""
        return f"{self.prefix}leader:traffic"

    def batch(self, batch_id: str) -> str:
        """A batch's metadata, counters and webhook log (hash)."""
        return f"{self.prefix}batch:{batch_id}"

    def batch_items(self, batch_id: str) -> str:
        """Job ids of a batch's enqueued lines, in line order (list)."""
        return f"{self.prefix}batch:{batch_id}:items"

    def batch_open(self, batch_id: str, model: str, variant: str) -> str:
        """Job ids of one partition not yet seen terminal, in stream order (list)."""
        return f"{self.prefix}batch:{batch_id}:open:{model}:{variant}"

    def batch_rejected(self, batch_id: str) -> str:
        """Lines refused at submit (invalid, or their partition was full), in line order."""
        return f"{self.prefix}batch:{batch_id}:rejected"

    @property
    def batches_active(self) -> str:
        """Batches not yet finished, scored by their expiry time in ms (sorted set)."""
        return f"{self.prefix}batches:active"

    def worker(self, name: str) -> str:
        """One worker's latest heartbeat (hash with a TTL; shared/worker_registry.py)."""
        return f"{self.prefix}worker:{name}"

    @property
    def workers(self) -> str:
        """Names of workers that sent a heartbeat, scored by its time in ms (sorted set)."""
        return f"{self.prefix}workers"

    def api_key(self, key_id: str) -> str:
        """One API key's record (hash): sha-256 of the key, tenant, scopes, limits; no key."""
        return f"{self.prefix}apikey:{key_id}"

    @property
    def api_key_index(self) -> str:
        """Ids of every API key (set), for `conveyor keys list`."""
        return f"{self.prefix}apikeys"

    def rate_bucket(self, key_id: str) -> str:
        """Token bucket of one API key (hash: tokens, ms timestamp), shared by all producers."""
        return f"{self.prefix}rl:{key_id}"

    def in_flight(self, key_id: str) -> str:
        """Jobs of one API key not yet seen terminal (sorted set: job id by admission ms)."""
        return f"{self.prefix}inflight:{key_id}"

    def in_flight_scan(self, key_id: str) -> str:
        """Marker that limits full rescans of an at-cap in-flight set to one per second."""
        return f"{self.prefix}inflight:{key_id}:scan"
