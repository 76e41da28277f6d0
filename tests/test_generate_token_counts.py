"""The tokens a job's token events carry add up to its usage. A generation's last engine step
often decodes no text (its end-of-sequence token, or held-back text a stop string then cut):
that step's tokens went into no token event, so an SSE client (the console's count too) summed
one token fewer than `usage.completion_tokens` for every generation that stopped by itself
(smollm2: 17 against 18). Such a step is a token event with empty text; OpenAI chunks skip it."""

from __future__ import annotations

import json

import anyio
import pytest
import redis.asyncio as aioredis

from conveyor.stack import Stack
from producer_api.openai.protocol import CompletionRequest
from producer_api.openai.serving import DONE, CompletionRenderer
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.token_stream import TokenEvent
from tests.test_llm_pipeline import read_events, submit_job
from tests.test_openai_stream_cut import openai_service
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_job import RunningJob
from workers.partition.stream_reader import Delivery
from workers.partition.token_writer import TokenAppend, TokenWriter

# A generation that ended by itself: text, then a last step with a token and no text.
CHUNKS = [
    TokenChunk("Yes", 1, None, prompt_tokens=5, completion_tokens=1),
    TokenChunk("", 1, "stop", prompt_tokens=5, completion_tokens=2),
]


def _events() -> list[TokenEvent]:
    """The token-stream events a worker writes for CHUNKS."""
    delivery = Delivery(b"1-0", None, JobStatus.RUNNING.value, 0)
    job = RunningJob(delivery, "lane", GenerateRequest("counted"), redelivered=False)
    return [event for chunk in CHUNKS for event in job.take(chunk, 1, 1)] + [job.final_event()]


def test_the_tokens_of_a_last_step_without_text_are_in_a_token_event() -> None:
    events = _events()
    counted = sum(event.tokens for event in events if event.kind == "token")
    assert counted == events[-1].usage["completion_tokens"] == 2, events


async def test_an_openai_stream_sends_no_chunk_for_a_step_without_text(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with openai_service(redis_url, aredis) as service:
        job_id = await service.submit(CompletionRequest(model="smollm2", prompt="Say", stream=True))
        events = _events()
        await TokenWriter(aredis, Keys(), 60).write(
            [TokenAppend(job_id, "run-a", 1, events, expire=True)], []
        )
        await aredis.hset(Keys().job(job_id), "status", JobStatus.SUCCEEDED.value)
        with anyio.fail_after(30):  # a hang guard only
            renderer = CompletionRenderer(job_id, "smollm2")
            opened = await service.open_stream(job_id, renderer)
            chunks = [c async for c in service.stream(job_id, opened, renderer, anyio.Event())]
    assert chunks[-1] == DONE, chunks
    choices = [json.loads(chunk)["choices"][0] for chunk in chunks[:-1]]
    assert [(c["text"], c["finish_reason"]) for c in choices] == [("Yes", None), ("", "stop")]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a smollm2 worker's start
def test_a_generation_that_stops_by_itself_counts_every_token_in_its_events(
    stack: Stack, smollm2_worker: None
) -> None:
    """On the real engine: SmolLM2 ends this answer with its end-of-sequence token, a step
    that decodes no text."""
    inputs = {"messages": [{"role": "user", "content": "Say just yes."}]}
    job_id = submit_job(stack.base_url, inputs, 40)
    events = read_events(stack.base_url, job_id)
    final = json.loads(events[-1]["data"])
    assert final["finish_reason"] == "stop", final
    counted = sum(json.loads(e["data"])["tokens"] for e in events if e["event"] == "token")
    assert counted == final["usage"]["completion_tokens"], (counted, final)
