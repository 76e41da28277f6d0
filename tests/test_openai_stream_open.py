"""A streamed OpenAI request whose job fails before its first token (a prompt past the model's
context, the model refusing the request) answers as the same request unstreamed does: 400 for
the context (vLLM's server refuses a stream's too-long prompt before opening it; OpenAI's SDK
raises BadRequestError), the job's failure otherwise. It was a 200 stream whose one chunk was
the error. An in-process producer on a real Valkey; the worker's own classes write the job's
token events, as in tests/test_generate_token_counts.py (the real engine's refusal is in
tests/test_openai_compat_shapes.py)."""

from __future__ import annotations

import anyio
import pytest
import redis.asyncio as aioredis

from producer_api.errors import ConveyorError
from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import ChatRenderer
from shared.generate_errors import ContextLengthExceeded
from shared.job_states import JobStatus
from shared.keys import Keys
from tests.test_openai_stream_cut import openai_service
from workers.engines.base import GenerateRequest
from workers.generation.generate_job import RunningJob
from workers.partition.stream_reader import Delivery
from workers.partition.token_writer import TokenAppend, TokenWriter

TOO_LONG = ContextLengthExceeded(3000, 2048)


async def fail(aredis: aioredis.Redis, job_id: str, error: dict[str, str]) -> None:
    """The job's worker ends it failed with `error` before its first token, as it writes a
    failure (tests/test_openai_edges_stream_error.py too)."""
    delivery = Delivery(b"1-0", None, JobStatus.RUNNING.value, 0)
    job = RunningJob(delivery, "lane", GenerateRequest(job_id), redelivered=False)
    job.error = error
    final = TokenAppend(job_id, job.attempt, 1, [job.final_event()], expire=True)
    await TokenWriter(aredis, Keys(), 60).write([final], [])
    await aredis.hset(Keys().job(job_id), "status", JobStatus.FAILED.value)


@pytest.mark.parametrize(
    ("error", "status", "type_"),
    [
        ({"type": "ContextLengthExceeded", "message": str(TOO_LONG)}, 400, "invalid_request"),
        ({"type": "ValueError", "message": "no such adapter"}, 422, "ValueError"),
    ],
)
async def test_a_job_that_failed_before_its_first_token_is_the_requests_error(
    redis_url: str, aredis: aioredis.Redis, error: dict[str, str], status: int, type_: str
) -> None:
    async with openai_service(redis_url, aredis) as service:
        message = ChatMessage(role="user", content="hi")
        request = ChatCompletionRequest(model="smollm2", messages=[message], stream=True)
        job_id = await service.submit(request)
        await fail(aredis, job_id, error)
        with anyio.fail_after(30), pytest.raises(ConveyorError) as refused:  # a hang guard
            await service.open_stream(job_id, ChatRenderer(job_id, "smollm2"))
    assert (refused.value.status, refused.value.type) == (status, type_), refused.value
    assert error["message"] in refused.value.message
    if status == 400:
        assert refused.value.param == "messages", refused.value
