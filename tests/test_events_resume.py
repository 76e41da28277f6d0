"""`Last-Event-ID` on `GET /v1/jobs/{id}/events`, through real processes (a producer, Valkey and,
for the streams that run, a worker serving the paced engine), as an EventSource uses it:

- A `final` made from the job (no entry of its own in the token stream: an LLM job cancelled
  while queued, or any job that is not an LLM's) came without an id, so a browser's EventSource
  reconnected after it for ever, each time sent it again. It has an id now, after which a
  resume is told 204 (the spec's "stop").
- An id the job's stream never sent was taken as a place to resume from: one from the far
  future sent nothing until the job's end, another job's skipped this job's text up to it,
  both silently. It is refused (422)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest

from conveyor.stack import Stack
from tests.conftest import REPO_ROOT, running_stack
from tests.test_llm_pipeline import sse_events

pytestmark = pytest.mark.slow
FIXTURES = REPO_ROOT / "tests" / "fixtures"
PROMPT = "the keeper climbed the stairs"
FAR_FUTURE = "99999999999999-0"
OPEN = {"CONVEYOR_AUTH": "disabled"}


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The paced LLM and a model that is not one (`tiny`), with no worker: jobs stay queued."""
    folder = tmp_path_factory.mktemp("idle")
    repository = folder / "repository"
    for model in (FIXTURES / "paced_repository" / "paced", FIXTURES / "model_repository" / "tiny"):
        shutil.copytree(model, repository / model.name)
    with running_stack(folder, CONVEYOR_MODEL_REPOSITORY=str(repository), **OPEN) as stack:
        yield stack


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("paced")
    repository = str(FIXTURES / "paced_repository")
    with running_stack(
        folder,
        CONVEYOR_MODEL_REPOSITORY=repository,
        PYTHONPATH=str(REPO_ROOT),  # the engine lives in tests/
        workers=("paced",),
        **OPEN,
    ) as stack:
        yield stack


def _submit(stack: Stack, model: str, inputs: dict[str, str], max_tokens: int = 4) -> str:
    body = {"model": model, "inputs": inputs, "parameters": {"max_tokens": max_tokens}}
    if model != "paced":
        body.pop("parameters")
    response = httpx.post(f"{stack.base_url}/v1/jobs", json=body, timeout=30)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _finished(stack: Stack, job_id: str) -> None:
    view = httpx.get(f"{stack.base_url}/v1/jobs/{job_id}", params={"wait": 30}, timeout=60).json()
    assert view["status"] == "succeeded", view


def _ran(stack: Stack) -> str:
    job_id = _submit(stack, "paced", {"prompt": PROMPT})
    _finished(stack, job_id)
    return job_id


def _open(stack: Stack, job_id: str, after: str | None = None) -> tuple[int, list[dict[str, str]]]:
    """The status of the job's event stream resumed after `after`, and its events (when 200)."""
    headers = {"Last-Event-ID": after} if after else {}
    url = f"{stack.base_url}/v1/jobs/{job_id}/events"
    with httpx.stream("GET", url, headers=headers, timeout=60) as response:
        if response.status_code != 200:
            return response.status_code, []
        return 200, list(sse_events(response.iter_lines()))


@pytest.mark.parametrize("model", ["paced", "tiny"])
def test_a_final_made_from_the_job_has_an_id_after_which_a_resume_is_told_204(
    idle: Stack, model: str
) -> None:
    inputs = {"prompt": PROMPT} if model == "paced" else {"x": "1"}
    job_id = _submit(idle, model, inputs)
    cancelled = httpx.delete(f"{idle.base_url}/v1/jobs/{job_id}", timeout=30)
    assert cancelled.status_code == 200, cancelled.text

    status, events = _open(idle, job_id)
    assert status == 200 and [e["event"] for e in events] == ["final"], events
    assert '"cancelled"' in events[0]["data"] and events[0].get("id") == "0-1", events[0]
    assert _open(idle, job_id, events[0]["id"]) == (204, [])


@pytest.mark.parametrize("model", ["paced", "tiny"])
def test_a_resume_of_a_queued_job_that_sent_no_id_is_refused(idle: Stack, model: str) -> None:
    inputs = {"prompt": PROMPT} if model == "paced" else {"x": "1"}
    job_id = _submit(idle, model, inputs)
    try:
        headers = {"Last-Event-ID": "1-0"}
        url = f"{idle.base_url}/v1/jobs/{job_id}/events"
        with httpx.stream("GET", url, headers=headers, timeout=60) as response:
            assert response.status_code == 422, response.status_code
            error = response.read().decode()
        assert "Last-Event-ID" in error and job_id in error, error
    finally:
        httpx.delete(f"{idle.base_url}/v1/jobs/{job_id}", timeout=30)


def test_a_resume_after_an_id_the_jobs_stream_never_sent_is_refused(paced: Stack) -> None:
    job_id, other = (_ran(paced) for _ in range(2))  # one after the other: see below
    status, events = _open(paced, job_id)
    ids = [e["id"] for e in events]
    assert status == 200 and events[-1]["event"] == "final", events
    # Entry ids come from the clock, so two jobs whose tokens were written in the same
    # millisecond share ids: only one the job's own stream does not hold is foreign to it.
    foreign_ids = [e["id"] for e in _open(paced, other)[1] if e["id"] not in ids]
    assert foreign_ids, "the second job's stream repeats every id of the first's"

    for foreign in (FAR_FUTURE, foreign_ids[0]):
        assert _open(paced, job_id, foreign) == (422, []), foreign
    assert [e["id"] for e in _open(paced, job_id, ids[1])[1]] == ids[2:]  # its own: the rest
    assert _open(paced, job_id, "0-0")[1] == events
