"""The Python SDK against the real pipeline (submit, get, wait, cancel, predict, batches, sync
and async, API keys from the environment), retrying a real 429 after its Retry-After, and
resuming an event stream whose connection is cut mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from conveyor.client import (
    APIError,
    AsyncClient,
    AuthError,
    Batch,
    Client,
    Conflict,
    InvalidArgument,
    NotFound,
    RetryEvent,
)
from conveyor.stack import Stack, free_port
from tests.conftest import REPO_ROOT, issue_key
from tests.local_http import LocalServer, serving

pytestmark = pytest.mark.slow
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"


def test_submit_get_wait_cancel(base_url: str, identity_worker: int) -> None:
    with Client(base_url) as client:
        job = client.submit("identity", {"x": [1, 2]})
        assert job.status == "queued" and job.urls is not None
        done = client.wait(job.id, timeout=30)
        assert done.succeeded and done.outputs == {"x": [1, 2]}
        assert client.get(job.id).status == "succeeded"

        first = client.submit("identity", {"k": 1}, idempotency_key="client-test-1")
        again = client.submit("identity", {"k": 1}, idempotency_key="client-test-1")
        assert again.id == first.id

        waiting = client.submit("identity", {"n": 1}, variant="canary")  # no canary worker
        assert client.cancel(waiting.id).status == "cancelled"
        with pytest.raises(Conflict):
            client.cancel(waiting.id)


def test_predict(base_url: str, minilm_worker: int) -> None:
    with Client(base_url) as client:
        job = client.predict("minilm", {"texts": ["hello", "world"]})
        assert len(job.outputs["embeddings"]) == 2 and len(job.outputs["embeddings"][0]) == 384
        with pytest.raises(APIError) as refused:
            client.predict("minilm", {"texts": "not a list"})
    assert refused.value.status == 422 and refused.value.type == "invalid_request"


async def test_embed_decodes_the_base64_it_asked_for(base_url: str, minilm_worker: int) -> None:
    """Sync and async: vectors as numbers either way, the same as `/predict` gives."""
    texts = ["hello", "a queue in front of a model"]
    with Client(base_url) as client:
        numbers = client.predict("minilm", {"texts": texts}).outputs["embeddings"]
        packed = client.embed("minilm", texts)
        plain = client.embed("minilm", texts[0], encoding_format="float")
        raw = client.embed("minilm", texts, encoding_format="base64")
    async with AsyncClient(base_url) as client:
        awaited = await client.embed("minilm", texts)
    for answer in (packed, awaited):
        assert answer.model == "minilm" and answer.usage is not None
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == 3 + 9
        vectors = [item.embedding for item in answer.data]
        assert all(isinstance(vector, list) for vector in vectors)
        np.testing.assert_allclose(np.array(vectors), np.array(numbers), atol=1e-6)
    np.testing.assert_allclose(plain.data[0].embedding, numbers[0], atol=1e-6)
    assert all(isinstance(item.embedding, str) for item in raw.data)


def test_a_batch_created_again_with_its_key_is_the_first_batch(
    base_url: str, identity_worker: int
) -> None:
    """What a create retried after its answer was lost sends: the first batch comes back, its
    lines run once."""
    lines = [{"custom_id": f"k{i}", "body": {"inputs": {"i": i}}} for i in range(3)]
    key = f"batch-{uuid.uuid4().hex}"
    with Client(base_url) as client:
        first = client.batches.create(lines, model="identity", idempotency_key=key)
        again = client.batches.create(lines, model="identity", idempotency_key=key)
        other = client.batches.create(lines, model="identity")
        done = client.batches.wait(first.id, poll_s=0.1)
    assert again.id == first.id != other.id
    assert done.counts.total == 3 and done.counts.succeeded == 3


async def test_async_client_runs_a_batch(base_url: str, identity_worker: int) -> None:
    seen: list[Batch] = []
    lines = [{"custom_id": f"a{i}", "body": {"inputs": {"i": i}}} for i in range(200)]
    lines.append({"custom_id": "bad", "body": {"nope": 1}})
    async with AsyncClient(base_url) as client:
        job = await client.predict("identity", {"hello": "async"})
        assert job.outputs == {"hello": "async"}
        batch = await client.batches.create(lines, model="identity")
        done = await client.batches.wait(batch.id, progress=seen.append, poll_s=0.1)
        results = await client.batches.results(batch.id)
    assert done.status == "completed" and done.counts.succeeded == 200
    assert seen[-1].status == "completed" and all(s.id == batch.id for s in seen)
    assert [o.outputs["i"] for o in results.outputs] == list(range(200))
    assert [(e.custom_id, e.line, e.error.type) for e in results.errors] == [
        ("bad", 201, "invalid_request")
    ]


async def test_a_batchs_create_asks_how_long_its_files_are_kept(base_url: str) -> None:
    """`output_expires_after` (s), sync and async: the create could not ask it, its files kept
    the result TTL; nor `metadata`. Its item waits for a canary worker none runs, so a cancel
    ends it."""
    lines = [{"custom_id": "c", "body": {"variant": "canary", "inputs": {}}}]
    tags = {"run": "7", "team": "search"}
    with Client(base_url) as client:
        made = client.batches.create(
            lines, model="identity", output_expires_after=3600, metadata=tags
        )
        ended = [(client.batches.cancel(made.id), 3600)]
    async with AsyncClient(base_url) as aclient:
        made = await aclient.batches.create(
            lines, model="identity", output_expires_after=7200, metadata=tags
        )
        ended.append((await aclient.batches.cancel(made.id), 7200))
    for batch, kept_s in ended:
        assert batch.cancelled_at is not None and batch.metadata == tags, batch
        errors = httpx.get(f"{base_url}/v1/files/{batch.error_file_id}").json()
        assert errors["expires_at"] == batch.cancelled_at + kept_s, errors


def test_environment_names_the_producer_and_the_key(
    auth_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = issue_key(auth_stack.redis_url, "acme", "submit", "read")
    monkeypatch.setenv("CONVEYOR_URL", auth_stack.base_url)
    monkeypatch.setenv("CONVEYOR_API_KEY", key)
    with Client() as client:
        job = client.submit("identity", {"who": "acme"})
        assert client.get(job.id).status == "queued"
    with Client(api_key="cv_not-a-key") as client, pytest.raises(AuthError) as refused:
        client.get(job.id)
    assert refused.value.status == 401


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://producer", "producer", "http://[::1"])
def test_a_url_that_cannot_be_a_producers_is_refused_at_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent, it failed only after every retry's backoff (~20 s), as if the producer were down."""
    with pytest.raises(ValueError, match=f"producer URL '{re.escape(url)}' is not an http"):
        Client(url)
    monkeypatch.setenv("CONVEYOR_URL", url)
    with pytest.raises(ValueError, match="is not an http"):
        AsyncClient()


@pytest.mark.parametrize("timeout", [float("nan"), -1.0])
def test_a_timeout_that_is_not_a_number_of_seconds_is_refused(timeout: float) -> None:
    """NaN waited forever (no clock reading is past it); a negative one gave up at once.
    Refused before any request: nothing listens at this URL."""
    with Client("http://127.0.0.1:9") as client:
        for wait in (client.wait, client.batches.wait):
            with pytest.raises(ValueError, match=f"timeout {timeout!r}: seconds, 0 or more"):
                wait("some-id", timeout=timeout)
        with pytest.raises(ValueError, match="seconds, 0 or more"):
            client.predict("identity", {}, timeout=timeout)


@pytest.mark.parametrize("poll_s", [float("nan"), -1.0, 0.0])
def test_a_batch_wait_polling_at_no_positive_pace_is_refused(poll_s: float) -> None:
    """NaN or a negative pause was time.sleep's ValueError after the first look, 0 polled the
    producer as fast as it answered. Refused before any request: nothing listens here."""
    refused = pytest.raises(InvalidArgument, match=f"poll_s {poll_s!r}: seconds between looks")
    with Client("http://127.0.0.1:9") as client, refused:
        client.batches.wait("some-id", poll_s=poll_s)


@pytest.mark.parametrize("job_id", ["../models", "..", "a/b", "x?attempts=true"])
def test_an_id_is_one_path_segment_and_reaches_no_other_route(base_url: str, job_id: str) -> None:
    """`get("../models")` read the model list (then failed to parse it as a job), and `cancel`
    of such an id sent its DELETE wherever the id's dots and slashes led."""
    with Client(base_url) as client:
        for call in (client.get, client.cancel, client.batches.get):
            with pytest.raises(NotFound):
                call(job_id)
        with pytest.raises(InvalidArgument, match="an id or name cannot be empty"):
            client.get("")


@pytest.fixture(scope="module")
def fixtures_url(stack: Stack) -> Iterator[str]:
    """A second producer on the same Valkey, serving the test models (`tiny` holds 5 jobs)."""
    name = "fixtures-producer"
    url = stack.start_producer(free_port(), name=name, CONVEYOR_MODEL_REPOSITORY=str(FIXTURES))
    yield url
    stack.stop_process(name)


def test_retries_honour_retry_after_on_a_real_429(stack: Stack, fixtures_url: str) -> None:
    pid = stack.start_worker("tiny", name="tiny", CONVEYOR_MODEL_REPOSITORY=str(FIXTURES))
    try:
        with Client(fixtures_url) as warm:  # a drain rate, from which the server's Retry-After
            for i in range(10):
                warm.wait(warm.submit("tiny", {"warm": i}).id, timeout=30)
        os.kill(pid, signal.SIGSTOP)  # the worker stops draining: the partition fills up
        codes = [
            httpx.post(f"{fixtures_url}/v1/jobs", json={"model": "tiny", "inputs": {}})
            for _ in range(6)
        ]
        assert [c.status_code for c in codes] == [202] * 5 + [429]
        # ten jobs drained in the last few seconds, maybe all in this one: about 1 s a job
        assert float(codes[-1].headers["Retry-After"]) in (1, 2), codes[-1].headers

        retries: list[RetryEvent] = []

        def resume_on_retry(event: RetryEvent) -> None:
            """Room comes back only once the client has met the 429, however slow this host."""
            retries.append(event)
            os.kill(pid, signal.SIGCONT)

        started = time.monotonic()
        with Client(fixtures_url, on_retry=resume_on_retry) as client:
            job = client.submit("tiny", {"after": "429"})
            elapsed = time.monotonic() - started
            assert client.wait(job.id, timeout=30).succeeded
    finally:
        os.kill(pid, signal.SIGCONT)
        stack.stop_process("tiny")
    assert retries and retries[0].reason == "HTTP 429"
    asked = retries[0].retry_after_s  # the Retry-After of the 429 this client got
    assert asked is not None and asked >= 1
    assert retries[0].delay_s >= asked and elapsed >= asked


class EventServer(LocalServer):
    """A tiny real SSE server: the events of a job are `token` 1..10 then `final` 11; the first
    connection is cut mid-event after event 4, the second ends cleanly (without the final
    event) after event 7, and each resumes from `Last-Event-ID`."""

    EVENTS = [(str(i), "token", f"chunk {i}") for i in range(1, 11)] + [("11", "final", "{}")]

    def __init__(self) -> None:
        super().__init__(_EventHandler)
        self.resumed_from: list[str | None] = []


class _EventHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EventServer

    def do_GET(self) -> None:
        last = self.headers.get("Last-Event-ID")
        self.server.resumed_from.append(last)
        start = int(last) if last else 0
        stop = {0: 4, 4: 7}.get(start, len(EventServer.EVENTS))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk("retry: 50\n: keep-alive\n\n")
        for event_id, name, data in EventServer.EVENTS[start:stop]:
            self._chunk(f"id: {event_id}\nevent: {name}\ndata: {data}\n\n")
        if start == 0:  # cut mid-event: the half-sent event 5 must not be delivered
            self._chunk("id: 5\nevent: token\ndata: chunk")
            self.connection.shutdown(2)
            return
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def event_server() -> Iterator[EventServer]:
    with serving(EventServer()) as server:
        yield server


EXPECTED = list(EventServer.EVENTS)


def test_stream_resumes_after_the_connection_drops(event_server: EventServer) -> None:
    with Client(event_server.url) as client:
        got = [(e.id, e.event, e.data) for e in client.stream("job-1")]
    assert got == EXPECTED
    assert event_server.resumed_from == [None, "4", "7"]


def test_async_stream_resumes_after_the_connection_drops(event_server: EventServer) -> None:
    async def collect() -> list[tuple[str | None, str, str]]:
        async with AsyncClient(event_server.url) as client:
            return [(e.id, e.event, e.data) async for e in client.stream("job-1")]

    assert asyncio.run(collect()) == EXPECTED
    assert event_server.resumed_from == [None, "4", "7"]


def test_files_feed_batches_and_are_read_and_deleted(base_url: str) -> None:
    """`client.files`: an upload kept the hour it asked, read back whole, listed, and fed to a
    batch by OpenAI's create (its metadata and its files' policy carried); the batch's errors
    file read by its id; the upload deleted. Its item waits for a canary worker none runs, so a
    cancel ends the batch."""
    lines = [{"custom_id": "c", "body": {"variant": "canary", "inputs": {}}}]
    with Client(base_url) as client:
        upload = client.files.create(lines, expires_after=3600)
        assert (upload.purpose, upload.filename) == ("batch", "batch.jsonl")
        assert upload.expires_at == upload.created_at + 3600
        assert client.files.get(upload.id) == upload
        assert json.loads(client.files.content(upload.id)) == lines[0]
        assert upload.id in [f.id for f in client.files.list(limit=100).data]
        batch = client.batches.create_from_file(
            upload.id, model="identity", metadata={"run": "7"}, output_expires_after=7200
        )
        ended = client.batches.cancel(batch.id)
        assert ended.input_file_id == upload.id and ended.metadata == {"run": "7"}, ended
        assert ended.cancelled_at is not None and ended.error_file_id is not None, ended
        errors = client.files.get(ended.error_file_id)
        assert (errors.purpose, errors.expires_at) == ("batch_output", ended.cancelled_at + 7200)
        assert json.loads(client.files.content(errors.id))["custom_id"] == "c"
        assert client.files.delete(upload.id).deleted
        with pytest.raises(NotFound):
            client.files.get(upload.id)


async def test_async_files_name_an_upload_by_its_path(base_url: str, tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text('{"custom_id": "a", "body": {"inputs": {}}}\n')
    async with AsyncClient(base_url) as client:
        upload = await client.files.create(source)
        assert upload.filename == "prompts.jsonl" and upload.bytes == source.stat().st_size
        assert await client.files.content(upload.id) == source.read_bytes()
        assert (await client.files.delete(upload.id)).deleted
