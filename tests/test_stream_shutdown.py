"""Open token streams on a producer, through real processes (producers, a worker running the
paced generate engine, Valkey), keys on:

- SIGTERM ends them cleanly instead of cutting them: an SSE stream gets a last `error` event
  with `retry:`, an OpenAI stream an error chunk then `data: [DONE]` (complete HTTP responses);
  the producer exits, the jobs run on, and the SSE client resumes on another producer with
  Last-Event-ID, missing nothing and repeating nothing.
- A frozen Redis (SIGSTOP) ends them the same clean way once a read times out, instead of
  cutting them mid-body: after SIGCONT the SSE client resumes with Last-Event-ID, missing
  nothing and repeating nothing, and both jobs run to their end.
- One tenant asking again and again to resume from an id beyond 64 bits (which once failed the
  shared token hub's read, stalling every stream ~0.5 s a time) does not slow another tenant's
  tokens.
- A revoked key ends its streams within CONVEYOR_STREAM_RECHECK_S, one of a queued job (nothing
  to send) too."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
import httpx
import pytest
import redis
from redis.exceptions import ClusterDownError

from conveyor.client import Client, StreamFailed
from conveyor.stack import Server, Stack, free_port
from producer_api.draining import Draining
from producer_api.events.api_router import server_sent
from producer_api.events.protocol import JobEvent
from producer_api.live_feed import while_holds
from producer_api.reply_listener import ReplyListener
from producer_api.stream_shutdown import SHUTDOWN, UNREACHABLE, until_cut
from producer_api.task_cancel import RECANCEL_S, cancel_and_wait
from shared.api_keys import ApiKeyStore, key_id_of
from shared.job_store import JobStore
from shared.keys import Keys
from shared.redis_client import connect
from tests.conftest import REPO_ROOT, issue_key, running_stack, until
from tests.test_llm_pipeline import sse_events
from tests.test_redis_freeze import frozen
from workers.runtime.consumer_runtime import ENGINE_CLOSE_S

pytestmark = pytest.mark.slow
PACED = str(REPO_ROOT / "tests" / "fixtures" / "paced_repository")
DOOMED = "doomed-producer"
T = TypeVar("T")
PROMPT = "the keeper climbed the stairs of the lighthouse as the storm came in"
STEP_S = 0.05  # the paced model's step_ms: its tokens come no faster
# The stack's CONVEYOR_STREAM_RECHECK_S (default 5 s): how soon an open stream notices its key
# revoked. Its CONVEYOR_STREAM_FIRST_EVENT_S (default 15 s): how long a streamed chat request
# waits for its job's first event before its headers are sent (a queued job's stream opens).
RECHECK_S = 1.0
FIRST_EVENT_S = 1.0
# Its CONVEYOR_STREAM_SHUTDOWN_GRACE_S (default 3 s): how long a stopping producer lets its
# streams say goodbye, and after how long its waiting requests answer.
STREAM_GRACE_S = 1.0
# The longest stop of a producer with requests waiting that the test below accepts.
STOPPED_WITHIN_S = STREAM_GRACE_S + 7


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Keys on, the `paced` model (a token every 50 ms) and one worker serving it. That worker
    drains nothing when the module ends (a grace of only its engine's close): the long jobs
    some tests leave running (a revoked key's) are aborted, not waited for."""
    folder = tmp_path_factory.mktemp("paced")
    grace = str(ENGINE_CLOSE_S)
    with running_stack(
        folder,
        workers=("paced",),
        CONVEYOR_MODEL_REPOSITORY=PACED,
        CONVEYOR_SHUTDOWN_GRACE_S=grace,
        CONVEYOR_STREAM_RECHECK_S=str(RECHECK_S),
        CONVEYOR_STREAM_FIRST_EVENT_S=str(FIRST_EVENT_S),
        CONVEYOR_STREAM_SHUTDOWN_GRACE_S=str(STREAM_GRACE_S),
        PYTHONPATH=str(REPO_ROOT),  # the engine lives in tests/
    ) as stack:
        yield stack


def _tokens(seconds: float) -> int:
    """`max_tokens` for a paced job that runs for at least `seconds`."""
    return math.ceil(seconds / STEP_S)


def _headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _submit(base_url: str, key: str, max_tokens: int) -> str:
    body = {
        "model": "paced",
        "inputs": {"prompt": PROMPT},
        "parameters": {"max_tokens": max_tokens},
    }
    response = httpx.post(f"{base_url}/v1/jobs", json=body, headers=_headers(key), timeout=30)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _events(base_url: str, key: str, job_id: str, after: str | None = None) -> list[dict[str, str]]:
    headers = _headers(key) | ({"Last-Event-ID": after} if after else {})
    url = f"{base_url}/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, headers=headers, timeout=120) as response:
        assert response.status_code == 200
        return list(sse_events(response.iter_lines()))


class Reader(threading.Thread):
    """Reads one streamed response to its end, keeping every event; `error` is what broke it."""

    def __init__(self, method: str, url: str, key: str, body: Any = None) -> None:
        super().__init__(daemon=True)
        self.request = (method, url, _headers(key), body)
        self.events: list[dict[str, str]] = []
        self.error: Exception | None = None
        self.job_id = ""

    def run(self) -> None:
        method, url, headers, body = self.request
        try:
            with httpx.stream(method, url, headers=headers, json=body, timeout=120) as response:
                assert response.status_code == 200, response.read()
                self.job_id = response.headers.get("x-conveyor-job-id", "")
                self.events.extend(sse_events(response.iter_lines()))
        except Exception as exc:  # an incomplete chunked read ends up here
            self.error = exc

    def count(self, needle: str) -> int:
        return sum(1 for e in self.events if needle in e.get("event", "") + e.get("data", ""))


class SdkChat(threading.Thread):
    """A streamed chat completion through the SDK (`Client.chat_stream`), counting its chunks;
    `error` is what it raised."""

    def __init__(self, base_url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.key = base_url, key
        self.chunks = 0
        self.error: Exception | None = None

    def run(self) -> None:
        messages = [{"role": "user", "content": PROMPT}]
        try:
            with Client(self.base_url, self.key) as client:
                for _ in client.chat_stream("paced", messages, max_tokens=400):
                    self.chunks += 1
        except Exception as exc:
            self.error = exc


def _open_streams(base_url: str, key: str, seconds: float) -> tuple[Reader, Reader]:
    """An SSE stream of a job of `seconds` and a streamed chat completion as long, both under
    way."""
    tokens = _tokens(seconds)
    job_id = _submit(base_url, key, tokens)
    sse = Reader("GET", f"{base_url}/v1/jobs/{job_id}/events", key)
    chat = {"model": "paced", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    openai = Reader("POST", f"{base_url}/v1/chat/completions", key, chat | {"max_tokens": tokens})
    sse.start()
    openai.start()
    until(lambda: sse.count("token") >= 3 and openai.count('"content"') >= 3)
    return sse, openai


def _ended_cleanly(sse: Reader, openai: Reader, why: str) -> None:
    """Both responses complete: SSE's last event an `unavailable` error with `retry:`, the
    OpenAI stream's an error chunk then `[DONE]`."""
    assert sse.error is None and openai.error is None, (sse.error, openai.error)
    last = sse.events[-1]
    assert last["event"] == "error" and int(last["retry"]) > 0, last
    assert '"unavailable"' in last["data"] and why in last["data"], last
    assert openai.events[-1]["data"] == "[DONE]"
    assert '"unavailable"' in openai.events[-2]["data"], openai.events[-2]


def _resumes_and_runs_on(stack: Stack, key: str, sse: Reader, openai: Reader) -> None:
    """The SSE client resumes after the last token it saw, missing and repeating nothing, and
    the OpenAI stream's job was not cancelled by the cut: it runs to its end."""
    job_id = sse.request[1].split("/")[-2]
    tokens = [e for e in sse.events if e["event"] == "token"]
    rest = _events(stack.base_url, key, job_id, tokens[-1]["id"])
    assert rest[-1]["event"] == "final" and '"succeeded"' in rest[-1]["data"], rest[-1]
    seen = [e["id"] for e in tokens + rest if e["event"] == "token"]
    whole = _events(stack.base_url, key, job_id)
    assert seen == [e["id"] for e in whole if e["event"] == "token"]  # none missed or repeated
    url = f"{stack.base_url}/v1/jobs/{openai.job_id}"
    view = httpx.get(url, params={"wait": 30}, headers=_headers(key), timeout=60).json()
    assert view["status"] == "succeeded", view


def test_sigterm_ends_open_streams_cleanly_and_the_job_resumes_elsewhere(paced: Stack) -> None:
    key = issue_key(paced.redis_url, "shutdown", "submit", "read")
    doomed = paced.start_producer(free_port(), name=DOOMED)
    # They end at the SIGTERM; one that did not would be cut STREAM_GRACE_S later, its job
    # still on.
    sse, openai = _open_streams(doomed, key, STREAM_GRACE_S + 2)

    exit_code = paced.stop_process(DOOMED)  # SIGTERM, then waits for the exit
    sse.join(30)
    openai.join(30)

    assert exit_code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    _ended_cleanly(sse, openai, "shutting down")
    _resumes_and_runs_on(paced, key, sse, openai)


@pytest.mark.parametrize("server", ["uvicorn", "conveyor"])
def test_sigterm_answers_waiting_requests_at_once_and_their_jobs_run_on(
    paced: Stack, server: Server
) -> None:
    """uvicorn lets requests in flight finish before the app stops: a long-poll waited out its
    wait, a non-streamed chat completion its whole generation, past an orchestrator's kill
    timeout, and their clients got a reset. Both now answer once the producer is asked to stop
    (after the streams' grace): the job as it stands, or 503 naming it. Under uvicorn's command
    line (compose, Kubernetes) and under `conveyor up`'s own server (producer_server.py)."""
    key = issue_key(paced.redis_url, "draining", "submit", "read")
    doomed = paced.start_producer(free_port(), name=DOOMED, server=server)
    # Both jobs run past the longest stop accepted below (and the few requests between their
    # start and the SIGTERM): a stop that passes answered while they ran, however loaded the
    # machine. A request that waits for its job's end cannot.
    tokens = _tokens(STOPPED_WITHIN_S + 1)
    job_id = _submit(doomed, key, tokens)
    chat = {
        "model": "paced",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
    }
    sent = [threading.Event(), threading.Event()]
    with ThreadPoolExecutor(2) as pool:
        url = f"{doomed}/v1/jobs/{job_id}"
        poll = pool.submit(_sent, "GET", url, sent[0], params={"wait": 60}, headers=_headers(key))
        whole = pool.submit(
            _sent,
            "POST",
            f"{doomed}/v1/chat/completions",
            sent[1],
            json=chat,
            headers=_headers(key),
        )
        until(lambda: _status(paced.base_url, key, job_id) == "running")
        _until_read(doomed, sent)  # uvicorn's stop would drop a request not read yet
        with redis.Redis.from_url(paced.redis_url) as client:  # the chat's job is admitted
            until(lambda: client.zcard(Keys().in_flight(key_id_of(key))) == 2)
        began = time.monotonic()
        exit_code = paced.stop_process(DOOMED, timeout=60)
        stopped_s = time.monotonic() - began
        polled, answered = poll.result(), whole.result()
    # within the grace a job that ends is still answered (test_faults.py); then the waits end
    assert exit_code in (0, -signal.SIGTERM) and stopped_s < STOPPED_WITHIN_S, stopped_s
    assert polled.status_code == 200 and polled.json()["status"] == "running", polled.text
    assert answered.status_code == 503 and answered.headers["Retry-After"] == "1", answered.text
    # an OpenAI SDK retries a 503 unless told not to: each retry ran the job again
    assert answered.headers["x-should-retry"] == "false", answered.headers
    running = answered.json()["error"]["job"]
    for ran_on in (job_id, running):  # neither was cancelled: each runs to its end
        view = httpx.get(
            f"{paced.base_url}/v1/jobs/{ran_on}",
            params={"wait": 30},
            headers=_headers(key),
            timeout=60,
        ).json()
        assert view["status"] == "succeeded", view


def _sent(method: str, url: str, sent: threading.Event, **kwargs: Any) -> httpx.Response:
    """The response to one request; `sent` is set once the whole request is on the wire."""

    def trace(event: str, _: dict[str, Any]) -> None:
        if event == "http11.send_request_body.complete":
            sent.set()

    with httpx.Client(timeout=90) as client:
        return client.request(method, url, extensions={"trace": trace}, **kwargs)


def _until_read(base_url: str, sent: list[threading.Event]) -> None:
    """Until the producer has read every request `sent` says is on the wire: it reads its
    connections in turn, so one it answers after they were all sent was read after them."""
    until(lambda: all(event.is_set() for event in sent))
    assert httpx.get(f"{base_url}/healthz", timeout=30).status_code == 200


def _status(base_url: str, key: str, job_id: str) -> str:
    url = f"{base_url}/v1/jobs/{job_id}"
    status: str = httpx.get(url, headers=_headers(key), timeout=30).json()["status"]
    return status


def test_a_frozen_redis_ends_open_streams_cleanly_and_they_resume(paced: Stack) -> None:
    """Once, such a stream was cut mid-body (an incomplete chunked read) when a Redis read
    timed out; now the producer ends it, Redis still frozen, within a read's timeout."""
    key = issue_key(paced.redis_url, "freeze", "submit", "read")
    sse, openai = _open_streams(paced.base_url, key, 10)
    with frozen(paced):
        until(lambda: not sse.is_alive() and not openai.is_alive())
    _ended_cleanly(sse, openai, "unreachable")
    _resumes_and_runs_on(paced, key, sse, openai)


ATTACKS = 30
ATTACK_EVERY_S = 0.1
STALL_S = 0.3  # the paced model's tokens come every 50 ms


def _token_times(
    base_url: str, key: str, job_id: str, times: list[float], enough: threading.Event
) -> None:
    """When each token event of the job's stream came, until the stream ends or `enough` is
    set (the stream is closed then; the job runs on)."""
    url = f"{base_url}/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, headers=_headers(key), timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("event: token"):
                times.append(time.monotonic())
            if enough.is_set():
                return


async def _attack(base_url: str, key: str, job_id: str) -> list[int]:
    headers = _headers(key) | {"Last-Event-ID": "99999999999999999999-0"}
    codes = []
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        for _ in range(ATTACKS):
            codes.append((await client.get(f"/v1/jobs/{job_id}/events")).status_code)
            await asyncio.sleep(ATTACK_EVERY_S)
    return codes


def _stalled_s(times: list[float], start: float, end: float) -> float:
    """How long the stream stalled between `start` and `end`: its gaps of STALL_S or more."""
    inside = [t for t in times if start <= t <= end]
    return sum(gap for a, b in itertools.pairwise(inside) if (gap := b - a) >= STALL_S)


def test_a_tenant_with_bad_resume_ids_does_not_slow_another_tenants_tokens(paced: Stack) -> None:
    victim = issue_key(paced.redis_url, "victim", "submit", "read")
    attacker = issue_key(paced.redis_url, "attacker", "submit", "read")
    attacker_job = _submit(paced.base_url, attacker, 2)
    victim_job = _submit(paced.base_url, victim, 200)  # 10 s of tokens
    times: list[float] = []
    enough = threading.Event()
    follow = threading.Thread(
        target=_token_times,
        args=(paced.base_url, victim, victim_job, times, enough),
        daemon=True,
    )
    follow.start()
    until(lambda: len(times) >= 40)  # its baseline: 2 s of undisturbed tokens
    start = time.monotonic()
    codes = asyncio.run(_attack(paced.base_url, attacker, attacker_job))
    end = time.monotonic()
    # Only the tokens up to the first after the attack count (below): the rest of the job's
    # 10 s is not waited for. A stream that ends first is seen ending, as before.
    until(lambda: times[-1] > end or not follow.is_alive(), timeout=60)
    enough.set()
    follow.join(60)

    assert set(codes) == {422}, codes
    assert times[-1] > end, "the stream ended before the attack did; make it longer"
    # Each bad request once stalled every stream of the producer for ~0.5 s: the next came
    # within ~0.1 s, so the stream stalled for most of the attack. A loaded machine's odd
    # stall stays far below half of it.
    stalled = _stalled_s(times, start, end)
    assert stalled < (end - start) / 2, (stalled, end - start)


async def test_a_cluster_failing_over_ends_a_stream_as_an_outage_does() -> None:
    """CLUSTERDOWN mid-stream (a master failing over, after the client's retries) escaped: the
    body was torn off with no last event, and an OpenAI stream cancelled its job."""

    async def events() -> AsyncIterator[int]:
        yield 1
        raise ClusterDownError("CLUSTERDOWN The cluster is down")

    assert [event async for event in until_cut(events(), anyio.Event())] == [
        1,
        UNREACHABLE,
    ]


async def _ending_with(last: T, *, ends: bool) -> AsyncIterator[T]:
    """`last`, then the end if `ends`; else nothing more, ever (the job runs on)."""
    yield last
    if not ends:
        await asyncio.Event().wait()


async def _seen_when_shutdown_comes(
    follow: Callable[[AsyncIterator[T], anyio.Event], AsyncIterator[Any]],
    events: AsyncIterator[T],
) -> list[Any]:
    """What `follow` gives when the producer is asked to stop while each event is handled."""
    shutdown, seen = anyio.Event(), []
    async with asyncio.timeout(30):  # a hang guard only
        async for event in follow(events, shutdown):
            seen.append(event)
            shutdown.set()
    return seen


async def test_a_shutdown_just_after_the_last_event_adds_no_error() -> None:
    """A stream that ran to its final event ended with an `unavailable` error after it when the
    producer was asked to stop meanwhile: the OpenAI SDK raised it, and its client ran the
    succeeded job again."""
    seen = await _seen_when_shutdown_comes(until_cut, _ending_with("final", ends=True))
    assert seen == ["final"]


async def test_a_shutdown_before_the_last_event_still_cuts_the_stream() -> None:
    seen = await _seen_when_shutdown_comes(until_cut, _ending_with("token", ends=False))
    assert seen == ["token", SHUTDOWN]


async def test_no_error_event_follows_a_final_one() -> None:
    """The job's `final` event ends the SSE stream's story, though its feed has yet to end."""
    final = JobEvent("final", {"status": "succeeded"}, "1-0")
    seen = await _seen_when_shutdown_comes(server_sent, _ending_with(final, ends=False))
    assert [event.event for event in seen] == ["final"]


async def test_a_producer_asked_to_stop_ends_every_wait(redis_url: str) -> None:
    """Reply waiters are woken with an empty view ("no end heard": the job is read as it
    stands), and a raced wait ends with None, its work cancelled."""
    client = connect(redis_url)
    keys = Keys("drain:")
    replies = ReplyListener(client, keys, "p1", JobStore(client, keys, 60))
    draining = Draining(replies, STREAM_GRACE_S)
    draining.start()
    finished = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(60)
        finally:
            finished.set()
        return "done"

    try:
        waiting = await replies.register("abcd" + "2" * 28)
        assert await draining.first(asyncio.sleep(0, "quick")) == "quick"
        assert await draining.first(work(), timeout=0.05) is None and finished.is_set()
        finished.clear()
        asyncio.get_running_loop().call_later(0.05, draining.begin)
        assert await draining.first(work()) is None and finished.is_set() and draining.asked()
        assert await asyncio.wait_for(waiting, 1) == {}
    finally:
        await draining.stop()
        await replies.stop()
        await client.aclose()


def test_a_revoked_key_ends_its_open_streams(paced: Stack) -> None:
    """A token stream outlived its key's revocation for as long as its job ran. Revoked, the
    key's streams end within RECHECK_S: the SSE stream with an `unauthorized` error event (its
    job runs on), the OpenAI stream with an `unauthorized` error chunk and `[DONE]`."""
    key = issue_key(paced.redis_url, "revoked", "submit", "read")
    job_id = _submit(paced.base_url, key, 400)  # 20 s of tokens
    sse = Reader("GET", f"{paced.base_url}/v1/jobs/{job_id}/events", key)
    chat = {"model": "paced", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    url = f"{paced.base_url}/v1/chat/completions"
    openai = Reader("POST", url, key, chat | {"max_tokens": 400})
    sdk = SdkChat(paced.base_url, key)
    for reader in (sse, openai, sdk):
        reader.start()
    until(lambda: sse.count("token") >= 3 and openai.count('"content"') >= 3 and sdk.chunks >= 3)
    asyncio.run(_revoke(paced.redis_url, key))
    sdk.join(RECHECK_S + 8)  # the SDK raises the error chunk (pydantic's ValidationError once)
    assert isinstance(sdk.error, StreamFailed) and sdk.error.type == "unauthorized", sdk.error
    for reader in (sse, openai):
        reader.join(RECHECK_S + 8)  # well before the jobs' 20 s of tokens are over
        assert not reader.is_alive() and reader.error is None, reader.error
    assert sse.events[-1]["event"] == "error" and '"unauthorized"' in sse.events[-1]["data"]
    assert not any(e["event"] == "final" for e in sse.events)
    assert openai.events[-1]["data"] == "[DONE]"
    assert '"unauthorized"' in openai.events[-2]["data"], openai.events[-2]


def test_a_revoked_key_ends_its_stream_of_a_queued_job(paced: Stack) -> None:
    """A stream sends nothing while its job waits, and its key was looked at only as events
    came: a revoked key's chat stream stayed open until a worker took the job, which then ran
    for it. Now it ends within RECHECK_S as a running job's does, and its job is cancelled
    before any worker runs it (here the worker is stopped)."""
    key = issue_key(paced.redis_url, "queued-revoked", "submit", "read")
    chat = {"model": "paced", "messages": [{"role": "user", "content": PROMPT}], "stream": True}
    openai = Reader("POST", f"{paced.base_url}/v1/chat/completions", key, chat | {"max_tokens": 5})
    store = redis.Redis.from_url(paced.redis_url, decode_responses=True)
    worker = paced.processes["paced"].pid
    os.kill(worker, signal.SIGSTOP)
    try:
        openai.start()
        until(lambda: openai.job_id)  # the stream is open (200), its job queued
        asyncio.run(_revoke(paced.redis_url, key))
        openai.join(RECHECK_S + 8)
        assert not openai.is_alive() and openai.error is None, openai.error
        assert openai.events[-1]["data"] == "[DONE]"
        assert '"unauthorized"' in openai.events[-2]["data"], openai.events[-2]
        assert len(openai.events) == 3, openai.events  # the role's opening chunk, no token
        status = store.hget(Keys().job(openai.job_id), "status")
        assert status == "cancelled", status
    finally:
        os.kill(worker, signal.SIGCONT)
        store.close()


async def test_a_silent_feed_ends_once_what_it_was_opened_under_is_gone() -> None:
    """The look is taken on time though no event comes, and an event slower than the period
    is still delivered, once, from the same generator (never restarted)."""
    started, closed, gone = [], asyncio.Event(), asyncio.Event()

    async def events() -> AsyncIterator[int]:
        started.append(1)
        try:
            await asyncio.sleep(0.3)  # three periods
            yield 1
            await asyncio.Event().wait()  # then nothing, ever
        finally:
            closed.set()

    async def holds() -> bool:
        return not gone.is_set()

    feed = while_holds(events(), holds, 0.1)
    async with asyncio.timeout(10):  # before, it waited for an event that never comes
        assert await anext(feed) == 1 and started == [1]
        gone.set()
        assert [event async for event in feed] == [] and closed.is_set()


async def test_a_feed_stopped_while_its_read_swallows_a_cancel_still_closes_it() -> None:
    """Stopped as `until_shutdown` stops it (the cancel repeated every RECANCEL_S) while its
    pending read swallowed the first cancel and ran on (gh-86296): the read is still seen
    through to its end and the generator closed, not left running."""
    swallowed, closed = asyncio.Event(), asyncio.Event()

    async def events() -> AsyncIterator[int]:
        try:
            yield 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.set()
            await asyncio.sleep(3 * RECANCEL_S)  # past the stopper's next cancel
            await asyncio.Event().wait()
        finally:
            closed.set()

    async def holds() -> bool:
        return True

    feed = while_holds(events(), holds, 60)
    assert await anext(feed) == 1
    reading = asyncio.ensure_future(anext(feed))
    await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await cancel_and_wait(reading)
    assert reading.cancelled() and swallowed.is_set() and closed.is_set()


async def _revoke(redis_url: str, key: str) -> None:
    client = connect(redis_url)
    try:
        assert await ApiKeyStore(client, Keys()).revoke(key_id_of(key))
    finally:
        await client.aclose()
