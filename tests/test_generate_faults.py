"""A generate engine that yields what no token stream can carry (bytes or no text, a thing that
is no TokenChunk) fails that job alone: it used to stop the loop that writes every running job's
tokens, and so the worker's consumer, while the process lived on reading nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis
import yaml

from conveyor.stack import Stack, free_port
from shared.keys import GROUP, Keys
from tests.conftest import REPO_ROOT, ended, until

pytestmark = pytest.mark.slow
PACED = REPO_ROOT / "tests" / "fixtures" / "paced_repository"
DEATH_FLAG = "death-flag"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`paced` (a token every 50 ms), whose variant `brittle`'s engine raises when asked to
    abort; `mortal`, the same, whose engine a prompt with <die> kills while DEATH_FLAG exists,
    and whose jobs are reclaimed a second after their worker is gone; `patient`, whose running
    entries are re-claimed every 2 s (a third of its visibility timeout)."""
    config = yaml.safe_load((PACED / "paced" / "config.yaml").read_text())
    repository = tmp_path_factory.mktemp("paced-repository")
    mortal = {**config, "queue": {"visibility_timeout_s": 1}}
    patient = {**config, "queue": {"visibility_timeout_s": 6}}
    mortal["parameters"] = {**config["parameters"], "death_flag": str(repository / DEATH_FLAG)}
    config["variants"]["brittle"] = {"weight": 0, "parameters": {"abort_fails": True}}
    for name, model in (("paced", config), ("mortal", mortal), ("patient", patient)):
        (repository / name).mkdir()
        (repository / name / "config.yaml").write_text(yaml.safe_dump(model))
    return repository


@pytest.fixture(scope="module")
def paced(stack: Stack, repository: Path) -> Iterator[tuple[str, int]]:
    """A producer and a `paced` worker (its URL, the worker's pid), on the session's Valkey."""
    env = {"CONVEYOR_MODEL_REPOSITORY": str(repository)}
    url = stack.start_producer(free_port(), "paced-producer", **env)
    pid = stack.start_worker("paced", "paced-worker", **env, PYTHONPATH=str(REPO_ROOT))
    yield url, pid
    stack.stop_process("paced-worker")
    stack.stop_process("paced-producer")


def _submit(
    url: str, prompt: str, variant: str = "default", max_tokens: int = 4, model: str = "paced"
) -> str:
    body = {
        "model": model,
        "variant": variant,
        "inputs": {"prompt": prompt},
        "parameters": {"max_tokens": max_tokens},
    }
    response = httpx.post(f"{url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _ended(url: str, job_id: str) -> dict[str, Any]:
    return ended(f"{url}/v1/jobs/{job_id}")


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
    assert succeeded["outputs"]["text"] == "a job that runs "
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


def test_a_dead_engine_hands_its_jobs_back_and_its_worker_exits(
    stack: Stack, paced: tuple[str, int], repository: Path
) -> None:
    """A dead engine (vLLM's engine-core process gone) fails every request at once: each job
    the worker read failed within milliseconds, the whole queue with them, while the worker
    lived on. Now its jobs stay pending and the worker exits; a new one runs them all."""
    paced_url, _ = paced
    env = {"CONVEYOR_MODEL_REPOSITORY": str(repository), "PYTHONPATH": str(REPO_ROOT)}
    (repository / DEATH_FLAG).touch()
    first = psutil.Process(stack.start_worker("mortal", "mortal-worker-1", **env))
    beside = _submit(paced_url, "a job that runs beside it", max_tokens=40, model="mortal")
    until(lambda: _status(paced_url, beside) == "running", 30)
    fatal = _submit(paced_url, "one <die> three", model="mortal")
    first.wait(timeout=60)  # raises if the worker lives on
    after = _submit(paced_url, "and one after", model="mortal")
    assert {_status(paced_url, job) for job in (beside, fatal, after)} <= {"queued", "running"}
    stack.start_worker("mortal", "mortal-worker-2", **env)
    try:
        ended = [_ended(paced_url, job) for job in (beside, fatal, after)]
        assert [job["status"] for job in ended] == ["succeeded"] * 3, ended
        assert ended[1]["attempts"] == 2, ended[1]  # the fatal job ran again, on the new worker
    finally:
        stack.stop_process("mortal-worker-2")


def test_a_generation_another_worker_took_over_is_given_up(
    stack: Stack, paced: tuple[str, int], repository: Path
) -> None:
    """A worker cut off from Redis past the visibility timeout finds, once back, its running
    entry reclaimed by another: its periodic XCLAIM took the entry back, and both workers
    generated the job, their tokens interleaved in its stream. Now it gives the job up."""
    paced_url, _ = paced
    env = {"CONVEYOR_MODEL_REPOSITORY": str(repository), "PYTHONPATH": str(REPO_ROOT)}
    stack.start_worker("patient", "patient-worker", **env)
    client = redis.Redis.from_url(stack.redis_url)
    try:
        job_id = _submit(paced_url, "a long answer", max_tokens=400, model="patient")
        until(lambda: _status(paced_url, job_id) == "running", 30)
        stream = Keys().queue("patient", "default")
        [entry] = client.xpending_range(stream, GROUP, "-", "+", 10)
        client.xclaim(stream, GROUP, "rescuer-7", 0, [entry["message_id"]], justid=True)
        until(lambda: _logged(stack, "patient-worker", "took the job over; giving it up"), 30)
        [after] = client.xpending_range(stream, GROUP, "-", "+", 10)
        assert after["consumer"] == b"rescuer-7"  # not taken back
        assert _status(paced_url, job_id) == "running"  # no result: the rescuer's to write
    finally:
        client.close()
        stack.stop_process("patient-worker")


def _logged(stack: Stack, name: str, text: str) -> bool:
    return any(text in line for line in stack.log_tail(name, 200))
