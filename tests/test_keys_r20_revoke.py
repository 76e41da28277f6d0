"""`conveyor keys revoke` with CONVEYOR_REPLICA_ACKS, on a real Valkey with a real replica: the
revocation was a plain HSET, acknowledged by the primary alone, so a failover before a replica
had it brought the revoked (maybe leaked) key back to life, and the operator was never told.
It now waits for the replicas a job's 202 waits for, and fails, saying so, when they fall
short; with acks off (the default) it waits for none, as every other write."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from conveyor.cli import main
from conveyor.embedded_valkey import start_embedded_valkey
from shared.api_keys import key_id_of
from shared.keys import Keys
from tests.conftest import issue_key, until

KEYS = Keys()


@pytest.fixture
def keys_cli(
    redis_url: str, redis_client: redis.Redis, settings_env: Callable[..., None], tmp_path: Path
) -> Callable[..., Result]:
    """`conveyor keys …` on the test's flushed Valkey, asking one replica's ack, its Redis
    timeout short (a WAIT that no replica answers gives up at half of it)."""
    settings_env(
        CONVEYOR_REDIS_URL=redis_url,
        CONVEYOR_STATE_DIR=str(tmp_path / "state"),
        CONVEYOR_REDIS_TIMEOUT_S="0.5",
        CONVEYOR_REPLICA_ACKS="1",
    )
    return lambda *args: CliRunner().invoke(main, ["keys", *args])


@pytest.fixture
def replica(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A client of a replica of the session's server, in sync when the test starts: the server
    syncs it at once, not after the 5 s it waits by default for more replicas to join."""
    delay = redis_client.config_get("repl-diskless-sync-delay")["repl-diskless-sync-delay"]
    redis_client.config_set("repl-diskless-sync-delay", 0)
    port = redis_client.connection_pool.connection_kwargs["port"]
    server = start_embedded_valkey(config={"replicaof": f"127.0.0.1 {port}"})
    client = redis.Redis.from_url(server.connection_url)
    try:
        until(lambda: redis_client.info("replication").get("slave0", {}).get("state") == "online")
        yield client
    finally:
        client.close()
        server.stop()
        redis_client.config_set("repl-diskless-sync-delay", delay)


def _waits(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_a_revoke_waits_for_the_replica(
    keys_cli: Callable[..., Result],
    redis_url: str,
    redis_client: redis.Redis,
    replica: redis.Redis,
    settings_env: Callable[..., None],
) -> None:
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="5")
    key_id = key_id_of(issue_key(redis_url, "acme", "read"))
    redis_client.config_resetstat()
    revoked = keys_cli("revoke", key_id)
    assert revoked.exit_code == 0, revoked.output
    assert revoked.output.strip() == f"revoked {key_id}"
    assert _waits(redis_client) == 1
    assert replica.hget(KEYS.api_key(key_id), "revoked_at")  # there once revoke returned


def test_a_revoke_no_replica_confirmed_fails_saying_so(
    keys_cli: Callable[..., Result],
    redis_url: str,
    replica: redis.Redis,
    settings_env: Callable[..., None],
) -> None:
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="5")  # a key's creation waits for the replica too
    key_id = key_id_of(issue_key(redis_url, "acme", "read"))
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="0.5")
    pid = int(replica.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)  # connected, but confirms nothing
    try:
        revoked = keys_cli("revoke", key_id)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert revoked.exit_code == 1, revoked.output
    assert "the revocation is not confirmed (fewer than 1 replicas confirmed" in revoked.stderr
    assert "run this again" in revoked.stderr
