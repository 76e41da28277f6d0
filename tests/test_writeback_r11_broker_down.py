"""On a real Valkey, its broker refusing connections (a Redis restart, or on a cluster kombu's
slot master failing over while the partition's node serves on): a write-back of jobs with
webhooks handed each event to the broker in turn, each refused only after kombu's retries, so
the worker's loop sat out one refusal per job (and logged each). Now the first refusal ends the
hand-over: the rest stay owed, for the reclaimer to send once they are overdue, as any refused
event is; none is lost."""

from __future__ import annotations

import logging
import socket

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from workers.partition.finish import Finish
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.result_writer import ResultWriter
from workers.partition.stream_reader import StreamReader

KEYS = Keys("broker-down:")
WORKER = "box-2-22"
PARTITION = Partition.of(KEYS, ModelConfig(name="m", kind="batch", backend="identity"), "v")
STREAM = PARTITION.online
JOBS = ("a", "b", "c")


def _refusing_broker() -> str:
    """A broker URL on a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


async def _results(client: aioredis.Redis) -> list[Finish]:
    """JOBS read by WORKER, each succeeded, each with a webhook."""
    store = JobStore(client, KEYS, ttl_s=60)
    for job_id in JOBS:
        payload = {"inputs": {}, "webhook": "https://hooks.example.com/x"}
        await store.create(RequestEntry(job_id, payload, now_ms()), STREAM, {"model": "m"})
    reader = StreamReader(client, KEYS, list(PARTITION.streams), WORKER)
    await reader.ensure_groups()
    [(_, deliveries)] = await reader.wait([STREAM], 10, 100)
    return [PARTITION.finish(d, JobStatus.SUCCEEDED, {"outputs": "{}"}) for d in deliveries]


async def test_a_write_back_stops_handing_events_to_a_broker_that_refused_one(
    aredis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    finishes = await _results(aredis)
    writer = ResultWriter(aredis, KEYS, 60, JobEvents(_refusing_broker()), WORKER)

    with caplog.at_level(logging.ERROR, logger="shared.webhook_events"):
        written = await writer.finish(STREAM, finishes)
    await writer.close()

    assert sorted(f.job_id for f in written) == list(JOBS)
    refused = [r for r in caplog.records if "not handed to delivery" in r.getMessage()]
    assert len(refused) == 1  # one per job before: the loop waited out each refusal
    owed = await aredis.zrange(KEYS.webhooks_owed(STREAM), 0, -1)
    assert sorted(owed) == [job_id.encode() for job_id in JOBS]  # all sent later, none lost
