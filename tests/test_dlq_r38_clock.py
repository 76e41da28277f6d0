"""`conveyor dlq replay` from a host whose clock runs 30 s behind Redis's (in process, on the
session's Valkey): it stamped its replayed jobs on that clock, and workers, judging them on
Redis's, expired every one whose `max_queue_time_s` was shorter. It measures the skew first, as
a producer does, and stamps on Redis's clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from click.testing import Result

from tests.test_clock_r38_sweep import NEAR_S, SKEW_S, _read_off
from tests.test_dlq_r11_operator import r  # noqa: F401 (a fixture)
from tests.test_dlq_r19_submit_checks import KEYS, MODEL, _letter, _queued, dlq  # noqa: F401


def test_a_replay_from_a_host_behind_redis_stamps_its_jobs_on_redis_clock(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _letter(r, {"inputs": {"text": "again"}})
    _read_off(monkeypatch, -SKEW_S)
    ran = dlq("replay", MODEL)
    assert ran.exit_code == 0, ran.output
    [new_job] = [line.split(" -> ")[1] for line in ran.stdout.splitlines() if " -> " in line]
    created_ms = float(r.hget(KEYS.job(new_job), "created") or 0)
    seconds, micros = r.time()
    assert abs(created_ms / 1000 - (seconds + micros / 1e6)) < NEAR_S, created_ms
    assert len(_queued(r)) == 1
