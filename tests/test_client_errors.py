"""The SDK's errors cross processes as they are raised: a Celery task or a process pool that
calls the SDK hands its error back pickled, and unpickled from its one formatted line an
APIError (a WaitTimeout) raised TypeError in the caller instead."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import httpx
import pytest

from conveyor.client import (
    APIError,
    Client,
    NotFound,
    StreamFailed,
    WaitTimeout,
)
from conveyor.client.errors import api_error
from conveyor.client.types import Job


@pytest.mark.parametrize(
    "error",
    [
        api_error(429, "rate_limited", "slow down", httpx.Headers({"Retry-After": "3"})),
        api_error(502, "http_error", "<html>Bad Gateway</html>"),
        StreamFailed(200, "unauthorized", "the key was revoked"),
    ],
)
def test_an_api_error_unpickles_with_its_fields(error: APIError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert (back.status, back.type, back.message, str(back)) == (
        error.status,
        error.type,
        error.message,
        str(error),
    )
    assert back.headers == error.headers


def test_a_wait_timeout_unpickles_with_the_job_last_seen() -> None:
    error = WaitTimeout("job j still queued after 1s", Job(id="j", status="queued"))
    back = pickle.loads(pickle.dumps(error))
    assert (str(back), back.last) == (str(error), error.last)


def _get(base_url: str, job_id: str) -> Job:
    with Client(base_url) as client:
        return client.get(job_id)


def test_a_process_pools_sdk_error_reaches_the_caller_typed(base_url: str) -> None:
    """A real producer's 404 for an unknown job, raised in a pool's process."""
    with ProcessPoolExecutor(1) as pool, pytest.raises(NotFound) as raised:
        pool.submit(_get, base_url, "0" * 32).result(timeout=60)
    assert (raised.value.status, raised.value.type) == (404, "not_found")
