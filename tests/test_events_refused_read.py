"""A job's event stream whose token stream Redis refuses to read (its key holds another type:
an operator's stray write, a key another tool reused) ends with an `error` event, its body
whole, through real processes (a producer and Valkey; no worker, so the job stays queued): the
refusal cut the body mid-stream, a chunked response its client read as a broken connection."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import REPO_ROOT, running_stack
from tests.test_llm_pipeline import sse_events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("idle")
    repository = str(REPO_ROOT / "tests" / "fixtures" / "paced_repository")
    with running_stack(
        folder, CONVEYOR_MODEL_REPOSITORY=repository, CONVEYOR_AUTH="disabled"
    ) as stack:
        yield stack


def test_a_token_stream_redis_refuses_to_read_ends_the_events_with_an_error(idle: Stack) -> None:
    body = {"model": "paced", "inputs": {"prompt": "a b"}, "parameters": {"max_tokens": 4}}
    job_id = httpx.post(f"{idle.base_url}/v1/jobs", json=body, timeout=30).json()["id"]
    redis.Redis.from_url(idle.redis_url).set(Keys().tokens(job_id), "not a stream")
    url = f"{idle.base_url}/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, timeout=60) as response:
        assert response.status_code == 200
        events = list(sse_events(response.iter_lines()))
    assert events[-1]["event"] == "error", events
    assert "WRONGTYPE" in events[-1]["data"], events[-1]
