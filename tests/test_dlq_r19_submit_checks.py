"""`conveyor dlq replay` admits a letter's job by today's submit checks (in process, on the
session's Valkey): the model's input schema and the webhook URL policy may have changed since
the job was submitted, and a replay they would refuse stays a letter, the output saying why."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from conveyor.cli import main
from producer_api.app import create_app
from shared.codec import RequestEntry
from shared.job_store import now_ms
from shared.keys import new_job_id
from shared.settings import Settings
from tests.app_client import app_client
from tests.test_dlq_r11_operator import KEYS, r  # noqa: F401 (a fixture)

MODEL = "strict"
DLQ = KEYS.dlq(MODEL, "default")
# the model as the repository has it now: its inputs need a `text`, which they once did not
CONFIG = """\
kind: batch
backend: identity
input_schema:
  type: object
  required: [text]
  properties: {text: {type: string}}
"""
HOOKS = "https://hooks.example.com/conveyor"  # the webhook allow-list's only entry, now


@pytest.fixture
def dlq(settings_env: Callable[..., None], redis_url: str, tmp_path: Path) -> Callable[..., Result]:
    """`conveyor dlq …` run in this process, with today's repository and webhook policy."""
    (tmp_path / "models" / MODEL).mkdir(parents=True)
    (tmp_path / "models" / MODEL / "config.yaml").write_text(CONFIG)
    settings_env(
        CONVEYOR_REDIS_URL=redis_url,
        CONVEYOR_KEY_PREFIX=KEYS.prefix,
        CONVEYOR_STATE_DIR=str(tmp_path),
        CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "models"),
        CONVEYOR_WEBHOOK_SECRET="s" * 32,
        CONVEYOR_WEBHOOK_ALLOWLIST=HOOKS,
    )
    return lambda *args: CliRunner().invoke(main, ["dlq", *args])


def _letter(client: redis.Redis, payload: dict[str, Any]) -> tuple[str, str]:
    """A dead letter as RECLAIM writes it: (its DLQ id, its job id)."""
    entry = RequestEntry(new_job_id(MODEL, "default"), payload, now_ms(), tenant="t1")
    fields: dict[Any, Any] = {"entry": "1-0", "lane": KEYS.queue(MODEL, "default")}
    fields |= {"reason": "dead-lettered", "deliveries": 3}
    return str(client.xadd(DLQ, fields | entry.encode())), entry.job_id


def _queued(client: redis.Redis) -> list[str]:
    """The ids of the jobs a replay enqueued, as replays of (`replay_of`)."""
    rows: Any = client.xrange(KEYS.queue(MODEL, "default"))
    return [fields["replay_of"] for _, fields in rows]


@pytest.mark.parametrize("by_id", [False, True])
def test_a_letter_that_todays_submit_checks_refuse_is_kept_and_says_why(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],
    by_id: bool,
) -> None:
    """A replay enqueued a job whose inputs the model's schema no longer accepts (it could only
    fail) and one whose webhook URL the allow-list no longer has (its events went where the
    policy now forbids): a submit of either is refused with a 422."""
    fits_id, fits = _letter(r, {"inputs": {"text": "ok"}, "webhook": f"{HOOKS}/a"})
    stale_id, stale = _letter(r, {"inputs": {"t": "once enough"}})
    banned_id, banned = _letter(r, {"inputs": {"text": "ok"}, "webhook": "https://old.example/h"})
    ids = [arg for dlq_id in (fits_id, stale_id, banned_id) for arg in ("--id", dlq_id)]
    ran = dlq("replay", MODEL, *(ids if by_id else []))
    assert ran.exit_code == 0, ran.output
    assert _queued(r) == [fits]
    lines = ran.stdout.splitlines()
    assert lines[1] == (
        f'kept {stale} (dead letter {stale_id}): input_invalid: inputs: "text" is a required'
        " property"
    )
    assert lines[2] == (
        f"kept {banned} (dead letter {banned_id}): webhook_refused: webhook URL"
        " 'https://old.example/h' is not in CONVEYOR_WEBHOOK_ALLOWLIST"
    )
    assert lines[3] == "replayed 1, kept 2" and "would be refused now" in ran.stderr
    left: Any = r.xrange(DLQ)
    assert [dlq_id for dlq_id, _ in left] == [stale_id, banned_id]


def test_the_cli_leaves_the_webhook_policy_to_an_environment_that_has_it(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],
    settings_env: Callable[..., None],
) -> None:
    """An operator's shell without the producers' CONVEYOR_WEBHOOK_SECRET does not know their
    webhook policy: read as "webhooks are disabled", it kept every letter with a webhook. The
    input schema, the CLI's repository's, is still checked."""
    settings_env(CONVEYOR_WEBHOOK_SECRET="", CONVEYOR_WEBHOOK_ALLOWLIST="")
    _, hooked = _letter(r, {"inputs": {"text": "ok"}, "webhook": "https://old.example/h"})
    _, stale = _letter(r, {"inputs": {"t": "once enough"}})
    ran = dlq("replay", MODEL)
    assert ran.exit_code == 0, ran.output
    assert _queued(r) == [hooked]
    assert f"kept {stale} " in ran.stdout and "replayed 1, kept 1" in ran.stdout


async def test_the_consoles_replay_runs_todays_submit_checks_too(
    r: redis.Redis,  # noqa: F811
    redis_url: str,
    tmp_path: Path,
) -> None:
    """The console's replay (the producer's settings) keeps the letter the CLI keeps, and its
    page says why."""
    (tmp_path / MODEL).mkdir()
    (tmp_path / MODEL / "config.yaml").write_text(CONFIG)
    stale_id, stale = _letter(r, {"inputs": {"t": "once enough"}})
    settings = Settings(
        redis_url=redis_url,
        key_prefix=KEYS.prefix,
        auth="disabled",
        model_repository=tmp_path,
        webhook_secret="s" * 32,
        webhook_allowlist=HOOKS,
    )
    async with app_client(create_app(settings)) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/console")).text)
        assert csrf is not None
        form = {"partition": f"{MODEL}:default", "upto": stale_id, "csrf": csrf[1]}
        done = await client.post("/console/dead-letters/replay", data=form)
    assert done.status_code == 200, done.text
    assert f"{stale}</a> (input invalid: inputs: &#34;text&#34; is a required property)" in (
        done.text
    )
    assert _queued(r) == [] and r.xlen(DLQ) == 1
