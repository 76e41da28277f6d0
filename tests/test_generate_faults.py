"""A generate engine that yields what no token stream can carry (bytes or no text, a thing that
is no TokenChunk) fails that job alone: it used to stop the loop that writes every running job's
tokens, and so the worker's consumer, while the process lived on reading nothing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psutil
import pytest
import yaml

from conveyor.stack import Stack, free_port
from tests.conftest import REPO_ROOT, until

pytestmark = pytest.mark.slow
PACED = REPO_ROOT / "tests" / "fixtures" / "paced_repository"


@pytest.fixture(scope="module")
def paced(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A producer and a worker (its URL, the worker's pid) for the `paced` model (a token every
    50 ms), on the session's Valkey; its variant `brittle`'s engine raises when asked to abort."""
    config = yaml.safe_load((PACED / "paced" / "config.yaml").read_text())
    config["variants"]["brittle"] = {"weight": 0, "parameters": {"abort_fails": True}}
    repository = tmp_path_factory.mktemp("paced-repository")
    (repository / "paced").mkdir()
    (repository / "paced" / "config.yaml").write_text(yaml.safe_dump(config))
    env = {"CONVEYOR_MODEL_REPOSITORY": str(repository)}
    url = stack.start_producer(free_port(), "paced-producer", **env)
    pid = stack.start_worker("paced", "paced-worker", **env, PYTHONPATH=str(REPO_ROOT))
    yield url, pid
    stack.stop_process("paced-worker")
    stack.stop_process("paced-producer")


def _submit(url: str, prompt: str, variant: str = "default", max_tokens: int = 4) -> str:
    body = {
        "model": "paced",
        "variant": variant,
        "inputs": {"prompt": prompt},
        "parameters": {"max_tokens": max_tokens},
    }
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


def test_an_abort_the_engine_refuses_fails_nothing_else(paced: tuple[str, int]) -> None:
    """Cancelling a running job asks the engine to abort it; an engine whose abort raised (a
    request it had already let go) stopped the publisher of every job's tokens."""
    paced_url, pid = paced
    doomed = _submit(paced_url, "a long answer to cancel", variant="brittle", max_tokens=200)
    until(lambda: _status(paced_url, doomed) == "running", 30)
    assert httpx.delete(f"{paced_url}/v1/jobs/{doomed}", timeout=30).status_code == 200
    after = _ended(paced_url, _submit(paced_url, "and one after", variant="brittle"))
    assert after["status"] == "succeeded" and psutil.Process(pid).is_running(), after
    assert _ended(paced_url, doomed)["status"] == "cancelled"


def _status(url: str, job_id: str) -> object:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()["status"]
