"""A `conveyor up` on a Redis Cluster tells the CLI so: its stack.json says the URL is a
cluster's node, and `keys`, `dlq` and `autoscale` in another shell, without CONVEYOR_REDIS_URL,
talk to it with a cluster client (a single server's failed on MOVED)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from conveyor.commands.up import redis_exports
from conveyor.local_stack import STATE_FILE, StackState, with_redis
from shared.settings import Settings

NODE = "redis://127.0.0.1:7001/0"  # never reached: a client is made, not used


@pytest.fixture
def stack_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings_env: Callable[..., None]
) -> Path:
    """The CLI's state dir, no CONVEYOR_REDIS_URL set: the stack.json there rules."""
    monkeypatch.delenv("CONVEYOR_REDIS_URL", raising=False)
    monkeypatch.delenv("CONVEYOR_REDIS_CLUSTER", raising=False)
    settings_env(CONVEYOR_STATE_DIR=str(tmp_path))
    return tmp_path


def _client_kind() -> tuple[type, str]:
    """The client class `keys` and `dlq` get from `with_redis`, and its settings' URL."""

    async def kind(client: aioredis.Redis, settings: Settings) -> tuple[type, str]:
        return type(client), settings.redis_url

    return with_redis(kind)


def test_a_cluster_stack_gets_a_cluster_client(stack_dir: Path) -> None:
    StackState(NODE, "http://127.0.0.1:8000", "", os.getpid(), redis_cluster=True).write(stack_dir)
    state = StackState.read(stack_dir)
    assert state is not None and state.redis_cluster
    client_class, url = _client_kind()
    assert issubclass(client_class, aioredis.RedisCluster) and url == NODE
    assert "CONVEYOR_REDIS_CLUSTER" not in os.environ  # set only while the client was made


def test_a_state_file_of_an_older_up_is_a_single_server(stack_dir: Path) -> None:
    """Written before the cluster flag: a single server, as it was."""
    state = {"redis_url": NODE, "producer_url": "", "dev_key_file": "", "pid": os.getpid()}
    (stack_dir / STATE_FILE).write_text(json.dumps(state))
    client_class, _ = _client_kind()
    assert not issubclass(client_class, aioredis.RedisCluster)


def test_the_banner_exports_the_cluster_flag() -> None:
    assert redis_exports(NODE, True) == f"CONVEYOR_REDIS_URL={NODE} CONVEYOR_REDIS_CLUSTER=1"
    assert redis_exports(NODE, False) == f"CONVEYOR_REDIS_URL={NODE}"
