"""A wait given to a thread's or a socket's timeout is bounded (a year): a finite value past
threading.TIMEOUT_MAX raised OverflowError where `inf` once did, in a worker's drain (its
consumer thread's join), its forced exit's timer, and every blocking Redis client's socket."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from shared.settings import MAX_TIMEOUT_S, Settings, get_settings
from workers import webhook_delivery


@pytest.mark.parametrize(
    "setting",
    [
        {"redis_timeout_s": 1e10},  # the socket's timeout: every blocking client's command
        {"shutdown_grace_s": 1e10},  # the consumer thread's join when a worker drains
        {"forced_exit_margin_s": 1e10},  # with the grace, a forced exit's timer
        {"block_ms": 10**13},  # on top of the socket timeout of a client that blocks
    ],
)
def test_a_wait_python_cannot_time_is_refused(setting: dict[str, float]) -> None:
    with pytest.raises(ValidationError, match="less than or equal to"):
        Settings(**setting)  # type: ignore[arg-type]


def test_the_longest_redis_timeout_accepted_still_gives_a_client_that_answers(
    settings_env: Callable[..., None], redis_url: str
) -> None:
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_REDIS_TIMEOUT_S=str(MAX_TIMEOUT_S))
    assert get_settings().redis_timeout_s == MAX_TIMEOUT_S
    webhook_delivery._redis.cache_clear()
    try:
        assert webhook_delivery._redis().ping()
    finally:
        webhook_delivery._redis().close()
        webhook_delivery._redis.cache_clear()
