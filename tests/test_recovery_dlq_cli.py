"""`conveyor dlq` as an operator runs it (a subprocess) against a real Valkey: purging every letter
asks first, an id that names no letter is said so, `show` prints one letter whole, a replay into
a model the repository no longer has is refused, and "replay all" is the letters there when it
began."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from shared.codec import RequestEntry
from shared.job_store import now_ms
from shared.keys import Keys, new_job_id
from tests.conftest import REPO_ROOT, until
from tests.test_dead_letter_replays import _dead_letter
from tests.test_queue_eta_deadlines import FIXTURES, IDLE, _measured

pytestmark = pytest.mark.slow
CONVEYOR = str(Path(sys.executable).parent / "conveyor")
KEYS = Keys("rcli:")
MODEL = "faulty"  # in the test repository
DLQ = KEYS.dlq(MODEL, "default")


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for key in client.scan_iter(match="rcli:*", count=1000):
        client.delete(key)
    yield client
    client.close()


def _dlq(
    redis_url: str,
    *args: str,
    stdin: str = "",
    repository: Path | None = None,
    keys: Keys = KEYS,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CONVEYOR_REDIS_URL": redis_url,
        "CONVEYOR_KEY_PREFIX": keys.prefix,
        "CONVEYOR_MODEL_REPOSITORY": str(
            repository or REPO_ROOT / "tests/fixtures/model_repository"
        ),
    }
    return subprocess.run(
        [CONVEYOR, "dlq", *args], input=stdin, capture_output=True, text=True, timeout=180, env=env
    )


def _letter(r: redis.Redis, model: str = MODEL, **payload: Any) -> tuple[str, str]:
    """A dead letter as RECLAIM writes it: (its DLQ id, its job id)."""
    entry = RequestEntry(new_job_id(model, "default"), {"inputs": payload}, now_ms(), tenant="t1")
    fields: dict[Any, Any] = {"entry": "1-0", "lane": KEYS.queue(model, "default")}
    fields |= {"reason": "dead-lettered after 3 deliveries", "deliveries": 3}
    dlq_id = r.xadd(KEYS.dlq(model, "default"), fields | entry.encode())
    return str(dlq_id), entry.job_id


def test_purging_every_letter_asks_first(redis_url: str, r: redis.Redis) -> None:
    """`purge` with no id deleted every letter at once, asking nothing (the console confirms)."""
    for n in range(3):
        _letter(r, n=n)
    refused = _dlq(redis_url, "purge", MODEL)  # no answer (not a terminal): nothing purged
    assert (
        refused.returncode == 1 and "Purge all 3 dead letters of faulty:default?" in refused.stdout
    )
    assert r.xlen(DLQ) == 3
    said_no = _dlq(redis_url, "purge", MODEL, stdin="n\n")
    assert said_no.returncode == 1 and r.xlen(DLQ) == 3
    assert _dlq(redis_url, "purge", MODEL, stdin="y\n").stdout.endswith("purged 3\n")
    _letter(r)
    assert _dlq(redis_url, "purge", MODEL, "--yes").stdout == "purged 1\n"
    assert r.xlen(DLQ) == 0


def test_an_id_that_names_no_letter_is_said_so(redis_url: str, r: redis.Redis) -> None:
    """A mistyped or already replayed id printed `replayed 0, kept 0` (or `purged 0`) and nothing
    else, as if there were nothing to say."""
    dlq_id, job_id = _letter(r)
    for action in ("replay", "purge"):
        ran = _dlq(redis_url, action, MODEL, "--id", "1-1", "--id", "not-an-id")
        assert ran.returncode == 0, ran.stderr  # a retried replay finds its letter gone
        assert ran.stderr.splitlines() == [
            "no dead letter 1-1 in faulty:default (replayed or purged already, or never one)",
            "'not-an-id' is not a dead letter's id (as `conveyor dlq list` prints them)",
        ]
    assert r.xlen(DLQ) == 1
    replayed = _dlq(redis_url, "replay", MODEL, "--id", dlq_id)
    assert replayed.stdout.startswith(f"{job_id} -> ") and replayed.stderr == ""


def test_show_prints_one_letter_whole(redis_url: str, r: redis.Redis) -> None:
    """`list` gives the reason only: what the job asked, its tenant and lane were not to be seen
    before a replay (and `show` was not a command)."""
    dlq_id, job_id = _letter(r, text="the poison")
    shown = json.loads(_dlq(redis_url, "show", MODEL, dlq_id).stdout)
    assert shown["dlq_id"] == dlq_id and shown["job_id"] == job_id
    assert shown["payload"] == {"inputs": {"text": "the poison"}}
    assert (shown["tenant"], shown["lane"], shown["deliveries"]) == (
        "t1",
        KEYS.queue(MODEL, "default"),
        3,
    )
    assert shown["reason"] == "dead-lettered after 3 deliveries"
    for unknown in ("1-1", "nope"):
        missing = _dlq(redis_url, "show", MODEL, unknown)
        assert missing.returncode == 1 and missing.stderr.startswith("Error: "), missing.stderr


def test_a_letter_that_is_no_job_is_listed_and_kept_not_a_traceback(
    redis_url: str, r: redis.Redis
) -> None:
    """RECLAIM dead-letters an entry its workers could not read (no `id`, a payload that is no
    JSON object) as it is: `list`, `show` and `replay` then died on it with `KeyError: b'id'`,
    every other letter of the partition unlisted and unreplayable. It is listed, shown and kept
    by a replay (with why), the others replayed."""
    good, job_id = _letter(r)
    fields = {"entry": "2-0", "reason": "r", "deliveries": "many", "payload": "[1"}
    bad = str(r.xadd(DLQ, fields))
    listed = _dlq(redis_url, "list", MODEL)
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[:3] for line in listed.stdout.splitlines()] == [
        [good, job_id, "3"],
        [bad, "-", "0"],  # no count: 0, where its ValueError ended `list`
    ]
    shown = _dlq(redis_url, "show", MODEL, bad)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["fields"]["payload"] == "[1"
    replayed = _dlq(redis_url, "replay", MODEL)
    assert replayed.returncode == 0, replayed.stderr
    assert f"kept - (dead letter {bad}): undecodable\n" in replayed.stdout
    assert replayed.stdout.startswith(f"{job_id} -> ")
    assert replayed.stdout.endswith("replayed 1, kept 1\n")
    assert [dlq_id for dlq_id, _ in r.xrange(DLQ)] == [bad]


def test_a_replay_into_a_model_no_longer_served_is_refused(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    """A model taken out of the repository (or a variant out of its config) has no worker: its
    letters' replays were queued all the same, `queued` for ever."""
    _letter(r, model="gone")
    refused = _dlq(redis_url, "replay", "gone")
    assert refused.returncode == 1, refused.stdout
    assert "unknown model 'gone'" in refused.stderr and "no worker" in refused.stderr
    assert r.xlen(KEYS.dlq("gone", "default")) == 1  # kept, for a purge or the model's return
    assert r.xlen(KEYS.queue("gone", "default")) == 0
    unreadable = _dlq(redis_url, "replay", "gone", repository=tmp_path / "missing")
    assert unreadable.returncode == 1 and "is not a directory" in unreadable.stderr


def test_replaying_all_replays_the_letters_there_when_it_began(
    redis_url: str, r: redis.Redis
) -> None:
    """ "All" is what the partition held when the replay began, as the console's confirmed "all"
    is: a letter that died meanwhile (a replayed poison job, dead again) was replayed by the same
    run, and again, for as long as the run went on."""
    pipe = r.pipeline(transaction=False)
    for n in range(3_000):
        entry = RequestEntry(new_job_id(MODEL, "default"), {"inputs": {"n": n}}, now_ms())
        pipe.xadd(DLQ, {"entry": "1-0", "reason": "r", "deliveries": 3, **entry.encode()})  # type: ignore[dict-item]
    pipe.execute()
    later: list[str] = []

    def die_meanwhile() -> None:
        until(lambda: r.xlen(KEYS.queue(MODEL, "default")) > 0, timeout=60, every=0.01)
        later.append(_letter(r)[0])

    dying = threading.Thread(target=die_meanwhile)
    dying.start()
    replayed = _dlq(redis_url, "replay", MODEL)
    dying.join()
    assert replayed.stdout.endswith("replayed 3000, kept 0\n"), replayed.stderr
    assert [dlq_id for dlq_id, _ in r.xrange(DLQ)] == later


def test_a_replay_fills_a_capped_lane_and_keeps_the_rest(redis_url: str, r: redis.Redis) -> None:
    """A replay pushed every letter into the lane past its `queue.max_length` (the API refused
    submits to it with 429 meanwhile): it fills the lane to its cap (5 for `tiny`), keeps the
    rest in the DLQ and says why."""
    kept = [_letter(r, model="tiny", n=n) for n in range(7)][5:]
    replayed = _dlq(redis_url, "replay", "tiny")
    assert replayed.stdout.endswith("replayed 5, kept 2\n"), replayed.stderr
    assert "lane is full" in replayed.stderr
    assert [dlq_id for dlq_id, _ in r.xrange(KEYS.dlq("tiny", "default"))] == [d for d, _ in kept]
    assert r.xlen(KEYS.queue("tiny", "default")) == 5


async def test_a_replay_keeps_a_letter_its_lane_cannot_start_by_its_deadline(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """For a model that admits by deadline, the CLI's replay enqueued a letter 100 entries
    back in a lane drained at 10 a second, its deadline 2 s off: it could only expire (its
    submit would be refused `deadline_unmeetable`). The CLI reads the lane's rate as a producer
    does, keeps the letter and says why."""
    keys = Keys()
    await _measured(aredis, IDLE, 100)
    job_id = await _dead_letter(aredis, "t", IDLE, now_ms() + 2_000, partition=(keys, "idle"))
    dlq = keys.dlq("idle", "default")
    ((dlq_id, _),) = await aredis.xrange(dlq)
    replayed = _dlq(redis_url, "replay", "idle", repository=FIXTURES, keys=keys)
    kept = f"kept {job_id} (dead letter {dlq_id.decode()}): deadline_unmeetable\n"
    assert replayed.stdout == f"{kept}replayed 0, kept 1\n", replayed.stderr
    assert "before the deadline" in replayed.stderr
    assert (await aredis.xlen(dlq), await aredis.xlen(IDLE)) == (1, 100)
