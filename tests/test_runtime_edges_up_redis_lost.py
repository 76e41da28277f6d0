"""`conveyor up` losing its Redis while it waits for its workers (each look at a worker's
readiness asks Redis) ends with one line naming that Redis, not the wait's traceback; `up`
then stops its children as on any other end of its start."""

from __future__ import annotations

import click
import pytest

from conveyor.commands.up import _one_line_if_redis_lost
from conveyor.stack import Stack


def test_redis_lost_while_workers_start_is_one_line(bare_stack: Stack) -> None:
    bare_stack.stop_process("valkey")
    with (
        pytest.raises(click.ClickException) as raised,
        _one_line_if_redis_lost(bare_stack.redis_url),
    ):
        bare_stack.wait_ready(bare_stack.spawn_worker("identity"))
    message = raised.value.format_message()
    assert message.startswith(f"lost Redis at {bare_stack.redis_url} ("), message
    assert "\n" not in message
