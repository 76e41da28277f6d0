"""A frozen Redis (SIGSTOP: connections stay open, nothing answers) is a fast 503, not a hang:
`/readyz` answers 503 within a load balancer's probe timeout, and submits, more of them at once
than the producer's pool holds, each answer 503 with Retry-After within a bounded time set by
`CONVEYOR_REDIS_TIMEOUT_S`. The token hub's blocking read timing out is a debug line, not the
warning an idle producer once logged every ~20 s. After SIGCONT everything recovers by itself.
Its own stack, so a frozen server never touches another test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis
from kombu.exceptions import OperationalError
from redis.exceptions import TimeoutError as RedisTimeoutError

from conveyor.stack import Stack
from producer_api.health.api_router import READY_TIMEOUT_S
from shared.keys import Keys
from shared.redis_client import OUT_OF_REACH, connect
from shared.settings import get_settings
from shared.webhook_events import WebhookDispatcher
from tests.conftest import running_stack, until

pytestmark = pytest.mark.slow
REDIS_TIMEOUT_S = 1.0
CLIENTS = 80  # more than the producer's pool (64): some wait for a connection first
# What a submit may take while Redis is frozen: a command's timeout, after waiting as long for
# a pooled connection, plus slack for a loaded machine. Before, submits hung as long as Redis.
SUBMIT_BOUND_S = 4 * REDIS_TIMEOUT_S + 4
BODY = {"model": "identity", "inputs": {"x": 1}}


@pytest.fixture(scope="module")
def freezable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("freeze")
    with running_stack(
        folder,
        CONVEYOR_AUTH="disabled",
        CONVEYOR_REDIS_TIMEOUT_S=str(REDIS_TIMEOUT_S),
        CONVEYOR_LOG_LEVEL="DEBUG",
        CONVEYOR_MAX_WAIT_S="2",  # an embeddings answer's long polls look at Redis this often
    ) as stack:
        yield stack


@contextmanager
def frozen(stack: Stack) -> Iterator[None]:
    """Valkey stopped (SIGSTOP to its process group: the wrapper and the server), and always
    continued on the way out."""
    group = os.getpgid(stack.processes["valkey"].pid)
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)


async def _submits(base_url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base_url, timeout=SUBMIT_BOUND_S, limits=limits) as c:
        return list(await asyncio.gather(*(c.post("/v1/jobs", json=BODY) for _ in range(CLIENTS))))


def _unavailable(response: httpx.Response) -> bool:
    return (
        response.status_code == 503
        and response.headers.get("retry-after") is not None
        and response.json()["error"]["type"] == "unavailable"
    )


def _hub_lines(log: Path) -> list[dict[str, str]]:
    """The token hub's log records (JSON lines) so far."""
    lines = (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line["name"] == "producer_api.token_hub"]


def test_a_frozen_redis_is_a_fast_503_and_recovers(freezable: Stack) -> None:
    url = freezable.base_url
    log = freezable.log_dir / "producer.log"
    assert httpx.post(f"{url}/v1/jobs", json=BODY, timeout=30).status_code == 202
    with frozen(freezable):
        # A load balancer's probe (a 1 s timeout) sees a 503 rather than timing out: the
        # producer's own READY_TIMEOUT_S ended the ping (a bare TimeoutError), not the Redis
        # client's REDIS_TIMEOUT_S. The client here waits longer only for a loaded machine.
        ready = httpx.get(f"{url}/readyz", timeout=READY_TIMEOUT_S + 3)
        assert ready.status_code == 503 and ready.json()["error"]["type"] == "unavailable"
        assert ready.json()["error"]["message"] == "redis unreachable: TimeoutError()", ready.text
        # No submit times out (the client's timeout is the bound); each is a 503 to retry.
        responses = asyncio.run(_submits(url))
        assert all(_unavailable(r) for r in responses), {r.status_code for r in responses}
        # The hub's read (blocking 5 s, timing out 1 s later) has nothing to do but time out.
        until(lambda: any("timed out" in line["message"] for line in _hub_lines(log)))
    until(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200)
    assert {line["level"] for line in _hub_lines(log)} == {"DEBUG"}, _hub_lines(log)
    assert httpx.post(f"{url}/v1/jobs", json=BODY, timeout=30).status_code == 202


def test_a_wait_that_runs_out_on_a_frozen_redis_still_answers_202(freezable: Stack) -> None:
    """The job was accepted before Redis froze: once the wait runs out, reading where it stands
    fails, and the answer is still the 202 with its id (a 503 would have it submitted twice)."""
    response = _answered_across_a_freeze(freezable, "/v1/jobs", BODY, wait=3)
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["status"] == "queued" and "queue_position" not in accepted, accepted


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/embeddings", {"model": "minilm", "input": "hi"}),
    ],
)
def test_an_openai_answer_a_frozen_redis_cut_is_not_to_be_retried(
    freezable: Stack, path: str, body: dict[str, object]
) -> None:
    """The job was enqueued (no worker serves it here) when Redis froze: the 503 names it and
    says x-should-retry: false. The generic 503 ("retry shortly") had the OpenAI SDK post the
    request again, a second job, while the first ran on."""
    response = _answered_across_a_freeze(freezable, path, body)
    assert response.status_code == 503, response.text
    assert response.headers["x-should-retry"] == "false", response.headers
    error = response.json()["error"]
    assert (
        error["message"]
        == f"the queue is unreachable; the job runs on: GET /v1/jobs/{error['job']}"
    )


def _answered_across_a_freeze(
    stack: Stack, path: str, body: dict[str, object], **params: int
) -> httpx.Response:
    """`path`'s answer to `body`, Redis frozen once the request's job is in its lane."""
    queue = Keys().queue(str(body["model"]), "default")
    store = redis.Redis.from_url(stack.redis_url)
    before = store.xlen(queue)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(
            httpx.post, f"{stack.base_url}{path}", params=params, json=body, timeout=30
        )
        until(lambda: store.xlen(queue) > before, every=0.02)
        with frozen(stack):
            response = answer.result(timeout=30)
    store.close()
    return response


def test_a_webhook_publish_gives_up_on_a_frozen_broker(
    freezable: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery's broker connections carry the same timeouts: handing a delivery to a frozen
    Redis raises (the caller logs it and moves on) instead of blocking its thread forever."""
    monkeypatch.setenv("CONVEYOR_REDIS_TIMEOUT_S", str(REDIS_TIMEOUT_S))
    get_settings.cache_clear()
    dispatcher = WebhookDispatcher(freezable.redis_url)
    event = {"type": "job.completed", "id": "freeze-test"}
    try:
        with ThreadPoolExecutor(1) as pool, frozen(freezable):
            sent = pool.submit(dispatcher.send, "job", "freeze-test", "http://127.0.0.1:9/", event)
            # Frozen ends before the pool waits for its thread. Generous: kombu retries a
            # failed publish a few times, each bounded by the timeout.
            with pytest.raises(Exception) as raised:
                sent.result(timeout=120)
        assert not isinstance(raised.value, FutureTimeout), "the publish hung"
        assert isinstance(raised.value, (*OUT_OF_REACH, OperationalError)), repr(raised.value)
    finally:
        get_settings.cache_clear()


async def test_a_write_a_frozen_server_cannot_take_times_out(freezable: Stack) -> None:
    """A command larger than the sockets' buffers stops mid-write on a frozen server: the write
    ends in redis-py's write timeout within the client's bound (not a hang), and the client
    works again once the server does."""
    client = connect(freezable.redis_url, blocks_ms=0, timeout_s=REDIS_TIMEOUT_S)
    try:
        assert await client.ping()
        with frozen(freezable), pytest.raises(RedisTimeoutError, match="writing to socket"):
            await asyncio.wait_for(client.set("big", b"x" * (64 << 20)), SUBMIT_BOUND_S)
        assert await client.ping()
    finally:
        await client.aclose()
