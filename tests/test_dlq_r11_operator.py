"""`conveyor dlq` as an operator runs it on a large or damaged dead-letter stream (in process,
on the session's Valkey): `list` holds a page of letters at a time, not the whole stream; `show`
says when the letter died and who ran each attempt; a DLQ key that is no stream is one line
naming it, not a traceback."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner, Result

from conveyor.cli import main
from shared.codec import RequestEntry
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from tests.conftest import REPO_ROOT
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer
from workers.partition.stream_reader import StreamReader

KEYS = Keys("r11dlq:")
MODEL = "faulty"  # in the test repository
DLQ = KEYS.dlq(MODEL, "default")


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for key in client.scan_iter(match=f"{KEYS.prefix}*", count=1000):
        client.delete(key)
    yield client
    client.close()


@pytest.fixture
def dlq(settings_env: Callable[..., None], redis_url: str, tmp_path: Path) -> Callable[..., Result]:
    """`conveyor dlq …` run in this process on the session's Valkey."""
    settings_env(
        CONVEYOR_REDIS_URL=redis_url,
        CONVEYOR_KEY_PREFIX=KEYS.prefix,
        CONVEYOR_STATE_DIR=str(tmp_path),
        CONVEYOR_MODEL_REPOSITORY=str(REPO_ROOT / "tests/fixtures/model_repository"),
    )
    return lambda *args: CliRunner().invoke(main, ["dlq", *args])


def test_listing_holds_a_page_of_letters_not_the_whole_stream(
    r: redis.Redis, dlq: Callable[..., Result]
) -> None:
    """`list` read every letter, payloads and all, before it printed the first: a DLQ of
    100,000 letters held them all in memory at once. It prints a page at a time, oldest first."""
    letters, text = 6_000, "x" * 2_000
    pipe = r.pipeline(transaction=False)
    for n in range(letters):
        entry = RequestEntry(f"job-{n}", {"inputs": {"text": text}}, 1.0)
        fields: dict[Any, Any] = {"entry": "1-0", "reason": "r", "deliveries": 3}
        pipe.xadd(DLQ, fields | entry.encode())
    pipe.execute()
    tracemalloc.start()
    try:
        listed = dlq("list", MODEL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert listed.exit_code == 0, listed.output
    assert [line.split("\t")[1] for line in listed.output.splitlines()] == [
        f"job-{n}" for n in range(letters)
    ]
    # every letter at once is some 3.4 KB each (over 20 MB); a page or two of 1,000 stays well
    # under the bound, for a stream of any length
    assert peak < letters * len(text), peak


async def _died_in_a_worker(redis_url: str, job_id: str) -> None:
    """`job_id` enqueued, taken by worker `host-a-101`, which died with it, then dead-lettered
    by another's reclaim (`max_deliveries` 1), as the real scripts do it."""
    config = ModelConfig(
        name=MODEL,
        kind="batch",
        backend="identity",
        queue=QueueLimits(visibility_timeout_s=0.05, max_deliveries=1),
    )
    partition = Partition.of(KEYS, config, "default")
    client = aioredis.Redis.from_url(redis_url)
    try:
        entry = RequestEntry(job_id, {"inputs": {"text": "the poison"}}, now_ms())
        fields = {"model": MODEL, "variant": "default"}
        await JobStore(client, KEYS, 60).create(entry, partition.online, fields)
        reader = StreamReader(client, KEYS, partition.streams, "host-a-101", mark_on_read=True)
        await reader.ensure_groups()
        assert await reader.take([partition.online], 1)
        await asyncio.sleep(0.1)  # past the visibility timeout: it died with the job
        reclaimer = Reclaimer(client, KEYS, partition, "host-b-7", 60, JobEvents("redis://unused"))
        assert await reclaimer.reclaim(partition.online) == []  # dead-lettered
    finally:
        await client.aclose()


def test_show_says_when_the_letter_died_and_who_ran_each_attempt(
    r: redis.Redis, dlq: Callable[..., Result], redis_url: str
) -> None:
    """`show` gave the reason and a delivery count: not when the job died, nor which worker ran
    each attempt (the job's record holds its attempts until it expires)."""
    asyncio.run(_died_in_a_worker(redis_url, "doomed"))
    ((dlq_id, _),) = r.xrange(DLQ)  # type: ignore[misc]
    ran = dlq("show", MODEL, dlq_id)
    assert ran.exit_code == 0, ran.output
    shown = json.loads(ran.output)
    assert shown["job_id"] == "doomed" and shown["deliveries"] == 1
    assert shown["died_ms"] == int(str(dlq_id).split("-")[0])
    ((attempt,),) = [shown["attempt_history"]]
    assert (attempt["consumer"], attempt["outcome"]) == ("host-a-101", "dead-lettered")
    assert attempt["started"] <= attempt["ended"] <= shown["died_ms"] / 1000


@pytest.mark.parametrize(
    "args",
    [("list", MODEL), ("show", MODEL, "1-1"), ("replay", MODEL), ("purge", MODEL, "--yes")],
)
def test_a_dlq_key_of_another_type_is_one_line_naming_it(
    r: redis.Redis, dlq: Callable[..., Result], args: tuple[str, ...]
) -> None:
    """A DLQ key that is no stream (written by hand, or a key prefix another app shares) ended
    every `dlq` command with Redis's WRONGTYPE traceback."""
    r.set(DLQ, "not a stream")
    ran = dlq(*args)
    assert ran.exit_code == 1 and isinstance(ran.exception, SystemExit), ran.exception
    assert ran.output.startswith(f"Error: {DLQ} is a string, not a stream"), ran.output
    assert ran.output.count("\n") == 1, ran.output
    assert r.get(DLQ) == "not a stream"
