"""On a real Valkey with no replica: a write CONVEYOR_REPLICA_ACKS asked replicas to confirm
while `conveyor up` started ended it with "lost Redis", since ReplicaAckTimeout is a
ConnectionError; Redis had answered, and the cure is the setting, not the server."""

from __future__ import annotations

from collections.abc import Callable

import click
import pytest

from conveyor.commands.up import _one_line_if_redis_lost
from tests.conftest import issue_key


def test_too_few_replicas_while_up_starts_is_said_as_such(
    redis_url: str, settings_env: Callable[..., None]
) -> None:
    settings_env(CONVEYOR_REPLICA_ACKS="1", CONVEYOR_REDIS_TIMEOUT_S="0.5")
    with pytest.raises(click.ClickException) as refused, _one_line_if_redis_lost(redis_url):
        issue_key(redis_url, "acme", "read")  # no replica confirms it
    message = refused.value.message
    assert not message.startswith("lost Redis"), message
    assert message.startswith("too few replicas confirmed a write to Redis at "), message
    assert "CONVEYOR_REPLICA_ACKS=1" in message
    assert "set CONVEYOR_REPLICA_ACKS=0 for a single-node dev stack" in message
