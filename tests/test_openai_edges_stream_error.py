"""A streamed request whose prompt turns out past the model's context only once its stream has
opened (its job waited in the queue past FIRST_EVENT_S) ends with an error chunk in the shape
its 400 has unstreamed: OpenAI's `invalid_request_error`, naming the prompt's field in `param`.
The chunk said Conveyor's `invalid_request` with no `param`, so OpenAI's SDK raised an APIError
whose `type` and `param` were not the ones the same request gets unstreamed (`BadRequestError`,
`invalid_request_error`, `messages`). An in-process producer on a real Valkey; the worker's own
classes write the job's failure, as in tests/test_openai_stream_open.py."""

from __future__ import annotations

import json

import anyio
import redis.asyncio as aioredis

from producer_api.openai.protocol import ChatCompletionRequest, ChatMessage
from producer_api.openai.serving import DONE, ChatRenderer
from tests.test_openai_stream_cut import openai_service
from tests.test_openai_stream_open import TOO_LONG, fail


async def test_a_prompt_refused_after_the_stream_opened_ends_it_as_openais_400(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    async with openai_service(redis_url, aredis) as service:
        message = ChatMessage(role="user", content="hi")
        request = ChatCompletionRequest(model="smollm2", messages=[message], stream=True)
        job_id = await service.submit(request)
        renderer = ChatRenderer(job_id, "smollm2")
        opened = await service.open_stream(job_id, renderer, wait_s=0.05)  # queued: it opens
        await fail(aredis, job_id, {"type": "ContextLengthExceeded", "message": str(TOO_LONG)})
        with anyio.fail_after(30):  # a hang guard only
            chunks = [
                chunk async for chunk in service.stream(job_id, opened, renderer, anyio.Event())
            ]
    assert chunks[-1] == DONE, chunks
    error = json.loads(chunks[-2])["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages"), error
    assert error["message"] == str(TOO_LONG), error
