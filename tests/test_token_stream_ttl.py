"""An LLM job's token stream is kept only CONVEYOR_TOKEN_STREAM_TTL_S (never longer than
CONVEYOR_RESULT_TTL_S) once its final event is written: its text lives on in the job's result,
and a day-long copy of every answer filled Redis. While it is written it keeps the result TTL,
so a long generation never loses its head. A reader of a finished job whose stream expired
still gets the job's final event, built from the job's hash: no hang, no 404."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack
from shared.keys import Keys, new_job_id
from shared.token_stream import TokenEvent
from tests.conftest import REPO_ROOT, running_stack, until
from tests.test_llm_pipeline import sse_events
from workers.partition.token_writer import TokenAppend, TokenWriter

KEYS = Keys("tokttl:")
RESULT_TTL_S = 60
TOKEN_TTL_S = 5
PACED = str(REPO_ROOT / "tests" / "fixtures" / "paced_repository")
PROMPT = "the keeper climbed the stairs"


def _token(text: str) -> TokenEvent:
    return TokenEvent("token", text=text, tokens=1)


async def test_a_stream_keeps_the_result_ttl_while_written_and_the_short_one_once_final(
    aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_TOKEN_STREAM_TTL_S=str(TOKEN_TTL_S))
    writer, job_id = TokenWriter(aredis, KEYS, RESULT_TTL_S), new_job_id("m", "default")
    key = KEYS.tokens(job_id)

    await writer.write([TokenAppend(job_id, "run-a", 1, [_token("A ")], expire=True)], [])
    assert TOKEN_TTL_S < await aredis.ttl(key) <= RESULT_TTL_S
    await writer.write([TokenAppend(job_id, "run-a", 2, [_token("B ")], expire=False)], [])
    assert TOKEN_TTL_S < await aredis.ttl(key) <= RESULT_TTL_S

    final = TokenEvent("final", status="succeeded", finish_reason="stop")
    await writer.write([TokenAppend(job_id, "run-a", 3, [final], expire=True)], [])
    assert 0 < await aredis.ttl(key) <= TOKEN_TTL_S


async def test_the_final_ttl_is_never_longer_than_the_result_ttl(
    aredis: aioredis.Redis, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_TOKEN_STREAM_TTL_S="600")
    writer, job_id = TokenWriter(aredis, KEYS, RESULT_TTL_S), new_job_id("m", "default")
    events = [_token("A "), TokenEvent("final", status="succeeded", finish_reason="stop")]

    await writer.write([TokenAppend(job_id, "run-a", 1, events, expire=True)], [])

    assert 0 < await aredis.ttl(KEYS.tokens(job_id)) <= RESULT_TTL_S


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The `paced` model (a token every 50 ms), one worker serving it, streams kept 5 s."""
    folder: Path = tmp_path_factory.mktemp("tokttl")
    with running_stack(
        folder,
        CONVEYOR_AUTH="disabled",
        CONVEYOR_MODEL_REPOSITORY=PACED,
        CONVEYOR_TOKEN_STREAM_TTL_S=str(TOKEN_TTL_S),
        PYTHONPATH=str(REPO_ROOT),  # the engine lives in tests/
        workers=("paced",),
    ) as stack:
        yield stack


def _finished(base_url: str, job_id: str) -> dict[str, object] | None:
    view: dict[str, object] = httpx.get(f"{base_url}/v1/jobs/{job_id}", timeout=30).json()
    return view if view["status"] == "succeeded" else None


@pytest.mark.slow
def test_a_finished_jobs_events_end_with_its_final_after_its_stream_expired(
    paced: Stack,
) -> None:
    body = {"model": "paced", "inputs": {"prompt": PROMPT}, "parameters": {"max_tokens": 3}}
    submitted = httpx.post(f"{paced.base_url}/v1/jobs", json=body, timeout=30)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    client = redis.Redis.from_url(paced.redis_url)
    key = Keys().tokens(job_id)
    try:
        until(lambda: _finished(paced.base_url, job_id), timeout=60, every=0.05)
        assert 0 < client.pttl(key) <= TOKEN_TTL_S * 1000
        client.delete(key)  # as its TTL will: the reader cannot tell the two apart
    finally:
        client.close()

    url = f"{paced.base_url}/v1/jobs/{job_id}/events"
    # a fresh reader; a resuming one, its text cut short, first told the job's whole text
    resumed = ["restart", "token", "final"]
    for headers, kinds in (({}, ["final"]), ({"Last-Event-ID": "1-0"}, resumed)):
        with httpx.stream("GET", url, headers=headers, timeout=60) as response:
            assert response.status_code == 200
            events = list(sse_events(response.iter_lines()))
        assert [event["event"] for event in events] == kinds
        if kinds == resumed:
            told = json.loads(events[1]["data"])
            assert told == {"text": "the keeper climbed ", "tokens": 3}
        final = json.loads(events[-1]["data"])
        assert final["status"] == "succeeded"
        assert final["finish_reason"] == "length"
        assert final["usage"]["completion_tokens"] == 3
    view = _finished(paced.base_url, job_id)
    assert view is not None  # the text lives on in the job's result
    assert view["outputs"] == {
        "text": "the keeper climbed ",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
