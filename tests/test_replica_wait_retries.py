"""With `CONVEYOR_REPLICA_ACKS` a write pipeline ends with a WAIT on the connection of each
master it wrote to. redis-py sends a cluster pipeline that lost a connection again, whole, but
without the targets its commands named (it pops each as it routes it): the WAIT went to the
client's default node, on a connection that wrote nothing, and passed at once whatever the
replicas held. On a real local Valkey Cluster, the first send of a WAIT cut as a dropped
connection would cut it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from conveyor.valkey_cluster import LocalCluster
from producer_api.jobs.group_commit import group_committing
from shared.redis_client import (
    NotResent,
    RedisClient,
    ReplicasMissing,
    WritesInTurn,
    check_replica_acks,
    connect,
    queue_replica_wait,
    run_pipeline,
)

pytestmark = pytest.mark.slow
_WAIT = b"\r\nWAIT\r\n"


def _url(cluster: LocalCluster) -> str:
    return f"redis://127.0.0.1:{cluster.masters[0].port}/0"


@pytest.fixture
async def acked(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> AsyncIterator[RedisClient]:
    """A cluster client as the processes make one, whose writes wait for one replica."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1", CONVEYOR_REPLICA_ACKS="1")
    made = connect(_url(cluster), blocks_ms=0)
    yield made
    await made.aclose()


@pytest.fixture
def wait_sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The port of each node a pipeline carrying a WAIT is sent to; the first such send fails
    as on a dropped connection (nothing reaches the server)."""
    ports: list[int] = []
    send = WritesInTurn.send_packed_command

    async def cut_once(self: WritesInTurn, command: Any, check_health: bool = True) -> None:
        if isinstance(command, list) and _WAIT in b"".join(command):
            ports.append(cast(Any, self).port)
            if len(ports) == 1:
                await self.disconnect(nowait=True)
                raise RedisConnectionError("Connection reset by peer")
        await send(self, command, check_health)

    monkeypatch.setattr(WritesInTurn, "send_packed_command", cut_once)
    return ports


async def _key_off_default_node(client: RedisClient) -> str:
    """A key another master than the client's default node serves: the node a WAIT sent
    without its target goes to."""
    cluster = cast(Any, client)
    await cluster.initialize()
    default = cluster.get_default_node().name
    keys = (f"cv:test:{{{tag}}}" for tag in range(100))
    return next(k for k in keys if cluster.get_node_from_key(k).name != default)


async def test_a_write_pipeline_cut_runs_again_with_its_wait_on_its_master(
    cluster: LocalCluster, acked: RedisClient, wait_sends: list[int]
) -> None:
    """`run_pipeline` (a worker's write-back, a Batch API create) builds it anew and runs it
    again: the writes and their WAIT on one connection of the key's master."""
    key = await _key_off_default_node(acked)

    async def fill(pipe: Any) -> int:
        pipe.set(key, "written")
        return await queue_replica_wait(acked, pipe, [key])

    waits, replies = await run_pipeline(acked, fill, [])

    assert wait_sends == [cluster.master_of(key).port] * 2  # cut, then run again, both there
    check_replica_acks(replies[-waits:])
    assert await acked.get(key) == b"written"


async def test_a_group_commit_flush_cut_is_an_outage(
    cluster: LocalCluster, acked: RedisClient, wait_sends: list[int]
) -> None:
    """A producer's flush (submits) is not sent again: its callers get the outage (a 503; a
    submit retried with its Idempotency-Key is enqueued once), not a WAIT that proved
    nothing."""
    committing = group_committing(acked, _url(cluster), "cut-flush")
    key = await _key_off_default_node(committing)
    try:
        with pytest.raises(RedisConnectionError):
            await committing.set(key, "written")
    finally:
        await committing.aclose()
    assert wait_sends == [cluster.master_of(key).port]


async def test_a_refusal_of_a_pipeline_with_a_wait_comes_through_as_itself(
    cluster: LocalCluster, acked: RedisClient
) -> None:
    """A server's refusal (NOREPLICAS: too few replicas for its min-replicas-to-write) is a
    reply, not a lost connection: it reaches `run_pipeline`'s caller as its own class (the
    producer's 503 that names it, Retry-After 5), not as a pipeline not sent again."""
    key = await _key_off_default_node(acked)
    master = cluster.master_of(key).client()

    async def fill(pipe: Any) -> int:
        pipe.set(key, "refused")
        return await queue_replica_wait(acked, pipe, [key])

    master.config_set("min-replicas-to-write", 10)
    try:
        with pytest.raises(ReplicasMissing) as refused:
            await run_pipeline(acked, fill, [])
    finally:
        master.config_set("min-replicas-to-write", 0)
        master.close()
    assert not isinstance(refused.value, NotResent)
    assert await acked.get(key) != b"refused"
