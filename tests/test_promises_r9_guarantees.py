"""README's "Delivery guarantees" and "Security" promises that no other test held to their
letter: how many deliveries an entry gets before its dead letter, a dead-letter stream that
nothing caps or expires, a receiver's clock window on both sides, and an operator's webhook
owner no tenant can be named. On a real Valkey, no worker process."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, InvalidKeySpec, KeySpec
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from shared.webhook_signing import OPERATOR, InvalidSignature, owner_secret, sign, verify
from tests.fault_engine import FaultEngine
from workers.batching.micro_batch_executor import execute
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r9-promises:")
TTL_S = 60
CONFIG = ModelConfig(
    name="m",
    kind="batch",
    backend="identity",
    queue=QueueLimits(visibility_timeout_s=0.05, max_deliveries=2),
)
PARTITION = Partition.of(KEYS, CONFIG, "default")
STREAM = PARTITION.online


async def _abandoned(client: aioredis.Redis, job_id: str) -> None:
    """`job_id` queued and read once by a worker that then died (its first delivery)."""
    entry = RequestEntry(job_id, {"inputs": {}}, now_ms())
    await JobStore(client, KEYS, TTL_S).create(entry, STREAM, {"model": "m", "variant": "default"})
    reader = StreamReader(client, KEYS, PARTITION.streams, "dead-1")
    await reader.ensure_groups()
    assert await reader.take([STREAM], 100)


async def _taken_over(reclaimer: Reclaimer) -> list[tuple[str, int]]:
    """The jobs one reclaim pass hands back to run, once the visibility timeout passed, each
    with its delivery count."""
    await asyncio.sleep(0.1)
    taken = await reclaimer.reclaim(STREAM)
    return [(d.entry.job_id, d.attempts) for d in taken if d.entry is not None]


async def test_an_entry_runs_max_deliveries_times_then_its_dead_letter_stays(
    aredis: aioredis.Redis,
) -> None:
    """ "Delivered more than `max_deliveries` times" moves it: the second delivery of a model
    with 2 runs, the third is the dead letter, and the letter stream has no TTL to lose it."""
    await _abandoned(aredis, "poison")
    reclaimer = Reclaimer(aredis, KEYS, PARTITION, "w-1", TTL_S, JobEvents("redis://unused"))

    assert await _taken_over(reclaimer) == [("poison", 2)]  # delivery 2 of 2: run again
    assert await aredis.xlen(KEYS.dlq("m", "default")) == 0
    assert await _taken_over(reclaimer) == []  # delivery 3: dead-lettered instead

    letters = await aredis.xrange(KEYS.dlq("m", "default"))
    assert [bool(fields[b"reason"]) for _, fields in letters] == [True]  # one letter, its reason
    assert await aredis.hget(KEYS.job("poison"), "status") == b"failed"
    assert await aredis.ttl(KEYS.dlq("m", "default")) == -1  # nothing expires it


def test_a_signature_dated_ahead_of_the_receivers_clock_is_refused() -> None:
    """A receiver "refuses a `t` more than 5 minutes from its clock": ahead of it too, or a
    delivery captured with a forward clock could be replayed for as long again."""
    body = b'{"id": "evt_1"}'
    header = sign("secret", body, timestamp=1_000_000)
    assert verify("secret", body, header, now=1_000_000 - 299) == 1_000_000
    with pytest.raises(InvalidSignature):
        verify("secret", body, header, now=1_000_000 - 301)


def test_a_header_verifies_when_any_of_its_digests_matches() -> None:
    """ "A header may carry more than one `v1`: the event verifies if any matches", wherever
    the matching one stands."""
    body = b'{"id": "evt_2"}'
    right = sign("new", body, timestamp=1_000_000).split(",")[1]
    for header in (f"t=1000000,v1={'0' * 64},{right}", f"t=1000000,{right},v1={'0' * 64}"):
        assert verify("new", body, header, now=1_000_000) == 1_000_000


async def test_no_tenant_can_be_named_as_the_operator(aredis: aioredis.Redis) -> None:
    """The operator's events are signed with `~operator`'s key, "no tenant can be so named":
    else a key for that tenant would hand its team the key that verifies canary events."""
    spec = KeySpec(tenant=OPERATOR, scopes=frozenset({"read"}))
    with pytest.raises(InvalidKeySpec):
        await ApiKeyStore(aredis, KEYS).create(spec)
    assert not await aredis.keys(KEYS.api_key("*"))
    assert owner_secret("secret", OPERATOR) != owner_secret("secret", "operator")


async def test_an_integer_past_64_bits_fails_its_own_job_alone() -> None:
    """Poison isolation: "an integer past 64 bits" is an output no job can store, so it fails
    its own job `InvalidOutput` and the rest of the micro-batch keeps its outputs."""
    config = ModelConfig(name="faulty", kind="batch", backend="tests.fault_engine:FaultEngine")
    engine = FaultEngine(config, "default", "")
    engine.load()
    outcomes = await execute(engine, [{"n": 0}, {"n": 1, "big": 2**64}, {"n": 2, "big": -(2**63)}])
    assert [o.error["type"] if o.error else None for o in outcomes] == [None, "InvalidOutput", None]
    assert [o.output["n"] for o in outcomes if o.output] == [0, 2]
