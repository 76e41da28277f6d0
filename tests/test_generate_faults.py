"""A generate engine that yields what no token stream can carry (bytes or no text, a thing that
is no TokenChunk) fails that job alone: it used to stop the loop that writes every running job's
tokens, and so the worker's consumer, while the process lived on reading nothing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psutil
import pytest

from conveyor.stack import Stack, free_port
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow
PACED = str(REPO_ROOT / "tests" / "fixtures" / "paced_repository")


@pytest.fixture(scope="module")
def paced(stack: Stack) -> Iterator[tuple[str, int]]:
    """A producer and a worker (its URL, the worker's pid) for the `paced` model (a token every
    50 ms), on the session's Valkey."""
    url = stack.start_producer(free_port(), "paced-producer", CONVEYOR_MODEL_REPOSITORY=PACED)
    pid = stack.start_worker(
        "paced", "paced-worker", CONVEYOR_MODEL_REPOSITORY=PACED, PYTHONPATH=str(REPO_ROOT)
    )
    yield url, pid
    stack.stop_process("paced-worker")
    stack.stop_process("paced-producer")


def _submit(url: str, prompt: str) -> str:
    body = {"model": "paced", "inputs": {"prompt": prompt}, "parameters": {"max_tokens": 4}}
    response = httpx.post(f"{url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _ended(url: str, job_id: str) -> dict[str, object]:
    job: dict[str, object] = httpx.get(
        f"{url}/v1/jobs/{job_id}", params={"wait": 30}, timeout=40
    ).json()
    return job


@pytest.mark.parametrize(("word", "kind"), [("<bytes>", "b'\\xff'"), ("<none>", "None")])
def test_a_chunk_no_stream_can_carry_fails_its_own_job(
    paced: tuple[str, int], word: str, kind: str
) -> None:
    paced_url, pid = paced
    worker = psutil.Process(pid)
    odd = _submit(paced_url, f"one {word} three four")
    beside = _submit(paced_url, "a job that runs beside it")
    failed, succeeded = _ended(paced_url, odd), _ended(paced_url, beside)
    assert failed["status"] == "failed", failed
    assert failed["error"] == {
        "type": "InvalidOutput",
        "message": "the engine yielded text or a finish reason that is no string: "
        f"TokenChunk(text={kind}, token_count=1, finish_reason=None, prompt_tokens=4, "
        "completion_tokens=2)",
    }
    assert succeeded["status"] == "succeeded", succeeded
    assert succeeded["outputs"]["text"] == "a job that runs "  # type: ignore[index]
    after = _ended(paced_url, _submit(paced_url, "and one after"))
    assert after["status"] == "succeeded" and worker.is_running(), after
