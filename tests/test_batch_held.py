"""A batch larger than its bulk lane's room is accepted, as OpenAI accepts up to 50,000 lines:
what the lane has no room for is held with the batch and fed in as room frees, never past the
lane's `queue.max_length` (it was a 413 "split the batch", or a 429 while other work was
queued). A producer run in-process on a real Valkey, with a model whose lane holds 2 entries;
no worker reads it: the test ends jobs as a worker would, then sweeps, as any producer does.
Once end to end too, through a real stack and worker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.batch_api import sweeper
from producer_api.batch_api.feeding import BatchFeeder
from producer_api.state import ProducerState
from shared.batch_api_store import BatchApiStore, HeldLane, held_lanes
from shared.codec import as_text
from shared.job_store import now_ms
from shared.keys import Keys
from shared.settings import Settings
from tests import test_batches
from tests.app_client import app_client
from tests.conftest import running_stack, until_async

KEYS = Keys("batch-held:")
LANE = KEYS.bulk_queue("tight", "default")
LIMIT = 2
LINES = 5
LINES_END_TO_END = 12  # three lanes' worth: fed over a few sweeps


Producer = tuple[httpx.AsyncClient, ProducerState]


@asynccontextmanager
async def _producer(redis_url: str, tmp_path: Path) -> AsyncIterator[Producer]:
    (tmp_path / "tight").mkdir()
    (tmp_path / "tight" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\n"
        f"queue: {{max_length: {LIMIT}}}\n"
    )
    settings = Settings(
        redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled", model_repository=tmp_path
    )
    app = create_app(settings)
    async with app_client(app) as client:
        yield client, app.state.conveyor


@pytest.fixture
async def producer(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path
) -> AsyncIterator[Producer]:
    """After `aredis` has flushed the database; its sweeper sweeps every second."""
    async with _producer(redis_url, tmp_path) as running:
        yield running


@pytest.fixture
async def hand_swept(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Producer]:
    """`producer`, whose own sweeper sweeps once as it starts: the test sweeps, in its order."""
    monkeypatch.setattr(sweeper, "INTERVAL_S", 3600)
    async with _producer(redis_url, tmp_path) as running:
        yield running


async def _create(client: httpx.AsyncClient, window: str = "24h") -> str:
    source = "".join(
        json.dumps({"custom_id": f"c{n}", "body": {"inputs": {"n": n}}}) + "\n"
        for n in range(LINES)
    )
    response = await client.post(
        "/v1/batches",
        params={"model": "tight", "completion_window": window},
        content=source,
        headers={"Content-Type": "application/jsonl"},
    )
    assert response.status_code == 202, response.text
    assert response.json()["counts"]["pending"] == LINES
    batch_id: str = response.json()["id"]
    return batch_id


async def _work_off(aredis: aioredis.Redis) -> None:
    """What a worker does to the lane's entries, in short: each queued job succeeds with its
    inputs as outputs (one ended already is skipped), and its entry leaves the lane."""
    for entry_id, entry in await aredis.xrange(LANE):
        job = KEYS.job(as_text(entry[b"id"]))
        if await aredis.hget(job, "status") == b"queued":
            outputs = json.dumps(json.loads(entry[b"payload"])["inputs"])
            fields = {"status": "succeeded", "outputs": outputs, "finished": now_ms()}
            await aredis.hset(job, mapping=fields)
        await aredis.xdel(LANE, entry_id)


async def _added(aredis: aioredis.Redis) -> int:
    """How many entries the lane was ever given."""
    return int(await aredis.get(KEYS.added(LANE)) or 0)


async def _ended(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
    return body if body["status"] in {"completed", "cancelled", "expired"} else None


async def _errors(client: httpx.AsyncClient, batch_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/batches/{batch_id}/errors")
    return [json.loads(line) for line in response.text.splitlines()]


async def test_a_batch_over_its_lanes_max_length_completes_every_line_in_order(
    hand_swept: Producer, aredis: aioredis.Redis
) -> None:
    client, state = hand_swept
    batch_id = await _create(client)
    sweeps = sweeper.BatchApiSweeper(state.batch_store, state.batch_progress)
    while await _ended(client, batch_id) is None:
        assert await aredis.xlen(LANE) <= LIMIT
        await _work_off(aredis)
        await sweeps.sweep()
    output = (await client.get(f"/v1/batches/{batch_id}/output")).text.splitlines()
    assert [json.loads(line)["outputs"] for line in output] == [{"n": n} for n in range(LINES)]
    assert [json.loads(line)["custom_id"] for line in output] == [f"c{n}" for n in range(LINES)]
    assert await _added(aredis) == LINES


async def test_a_cancel_ends_held_items_cancelled_and_never_enqueues_them(
    hand_swept: Producer, aredis: aioredis.Redis
) -> None:
    client, state = hand_swept
    batch_id = await _create(client)
    cancelled = await client.post(f"/v1/batches/{batch_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["counts"]["cancelled"] == LINES
    await _work_off(aredis)
    await sweeper.BatchApiSweeper(state.batch_store, state.batch_progress).sweep()
    assert await _added(aredis) == LIMIT
    errors = await _errors(client, batch_id)
    assert [e["custom_id"] for e in errors] == [f"c{n}" for n in range(LINES)]
    assert {(e["status"], e["error"]["by"]) for e in errors} == {("cancelled", "batch")}


async def test_held_items_left_when_the_window_ends_expire(
    producer: Producer, aredis: aioredis.Redis
) -> None:
    client, _ = producer
    batch_id = await _create(client, window="1s")
    ended = await until_async(lambda: _ended(client, batch_id), timeout=10)
    assert ended["status"] == "expired" and ended["counts"]["expired"] == LINES
    assert await _added(aredis) == LIMIT
    errors = await _errors(client, batch_id)
    assert [e["custom_id"] for e in errors] == [f"c{n}" for n in range(LINES)]
    assert {(e["status"], e["error"]["by"]) for e in errors} == {("expired", "batch")}


class _DiesBeforeItsRecord(BatchApiStore):
    """A producer killed between a chunk's ENQUEUE and its record of it."""

    async def fed(self, lane: HeldLane, head: bytes, job_ids: Any) -> bool:
        raise ConnectionError("the producer died")


async def test_a_feeder_killed_mid_feed_loses_and_duplicates_nothing(
    hand_swept: Producer, aredis: aioredis.Redis
) -> None:
    client, state = hand_swept
    batch_id = await _create(client)
    await _work_off(aredis)
    fields = await state.batch_store.read(batch_id)
    assert fields is not None
    dying = _DiesBeforeItsRecord(aredis, KEYS, state.settings.result_ttl_s)
    with pytest.raises(ConnectionError):
        await BatchFeeder(state.job_store, dying).feed(held_lanes(fields))
    assert await _added(aredis) == 2 * LIMIT  # enqueued, not recorded
    sweeps = sweeper.BatchApiSweeper(state.batch_store, state.batch_progress)
    await sweeps.sweep()  # another producer's: records them, enqueues nothing more
    assert await _added(aredis) == 2 * LIMIT
    while await _ended(client, batch_id) is None:
        await _work_off(aredis)
        await sweeps.sweep()
    output = (await client.get(f"/v1/batches/{batch_id}/output")).text.splitlines()
    assert [json.loads(line)["custom_id"] for line in output] == [f"c{n}" for n in range(LINES)]
    assert await _added(aredis) == LINES


async def test_two_batches_held_on_one_lane_share_its_room(
    hand_swept: Producer, aredis: aioredis.Redis
) -> None:
    """The second batch is not starved until the first is fed whole."""
    client, state = hand_swept
    first, second = await _create(client), await _create(client)
    await _work_off(aredis)
    await sweeper.BatchApiSweeper(state.batch_store, state.batch_progress).sweep()
    fed = [as_text(entry[b"batch"]) for _, entry in await aredis.xrange(LANE)]
    assert sorted(fed) == sorted([first, second])


def test_a_held_batch_runs_through_a_real_worker_in_line_order(tmp_path: Path) -> None:
    """End to end on a real stack: a 12-line batch on a lane of 4 entries, served by a real
    identity worker while the producer's sweeper feeds the rest in; every line answered, in
    order."""
    root = tmp_path / "models" / "tight"
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\nmax_batch_size: 2\n"
        "queue: {max_length: 4}\n"
    )
    numbers = range(LINES_END_TO_END)
    lines = "".join(
        json.dumps({"custom_id": f"c{n}", "body": {"inputs": {"n": n}}}) + "\n" for n in numbers
    )
    with running_stack(
        tmp_path / "stack",
        CONVEYOR_MODEL_REPOSITORY=str(root.parent),
        CONVEYOR_AUTH="disabled",
        workers=("tight",),
    ) as stack:
        created = test_batches._create(stack.base_url, lines, model="tight")
        assert created["request_counts"]["total"] == LINES_END_TO_END
        batch = test_batches._wait_ended(stack.base_url, created["id"], timeout=120)
        assert batch["status"] == "completed", batch
        output = test_batches._jsonl(stack.base_url, created["id"], "output")
    assert [row["custom_id"] for row in output] == [f"c{n}" for n in numbers]
    assert [row["outputs"] for row in output] == [{"n": n} for n in numbers]
