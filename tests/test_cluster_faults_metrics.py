"""A cluster out of reach is an outage (503, back off), never a 500, and a scrape of `GET /metrics`
still answers through it. redis-py raises RedisClusterException, no RedisError, from a client that
had read the topology: once a slot it asks for has lost its master (the topology it reads again on
CLUSTERDOWN leaves the slot uncovered) or once its nodes are all gone
(RedisClusterUnreachableError). Callers handle the outage classes (`OUT_OF_REACH`): KEDA's backlog
route, and every other route, answered 500, and a producer stopping meanwhile failed its shutdown.
On a real one-node Valkey Cluster, shared by the module; the last test stops it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster, local_cluster
from producer_api.app import create_app
from producer_api.metrics import api_router as metrics_route
from shared.redis_client import OUT_OF_REACH, RedisClient, connect
from shared.settings import get_settings
from tests.app_client import app_client

KEY = "cv:q:{0a1b}:echo:default"


@pytest.fixture(scope="module")
def lone_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of one master: the cheapest real cluster."""
    with local_cluster(tmp_path_factory.mktemp("lone-node"), masters=1, replicas=0) as formed:
        yield formed


@pytest.fixture
async def warm(lone_node: LocalCluster) -> AsyncIterator[RedisClient]:
    """A cluster client that has read the topology (a producer's, a worker's)."""
    client = connect(f"redis://127.0.0.1:{lone_node.masters[0].port}/0", cluster=True)
    await client.xadd(KEY, {"n": 1})
    yield client
    await client.aclose()


@pytest.fixture
def unserved(lone_node: LocalCluster, warm: RedisClient) -> Iterator[RedisClient]:
    """`warm`, then KEY's slot without a master (as after a master's loss with no replica to
    promote, under `cluster-require-full-coverage no`), served again afterwards."""
    slot = key_slot(KEY.encode())
    with lone_node.masters[0].client() as node:
        node.execute_command("CLUSTER DELSLOTS", slot)
        try:
            yield warm
        finally:
            node.execute_command("CLUSTER ADDSLOTS", slot)


async def test_a_slot_without_a_master_is_an_outage(unserved: RedisClient) -> None:
    with pytest.raises(OUT_OF_REACH):
        await unserved.xlen(KEY)
    async with unserved.pipeline(transaction=True) as transaction:
        transaction.xlen(KEY)
        with pytest.raises(OUT_OF_REACH):
            await transaction.execute()


def _repository(root: Path) -> Path:
    (root / "echo").mkdir(parents=True)
    (root / "echo" / "config.yaml").write_text(
        "kind: batch\nbackend: identity\ninput_schema: {type: object}\n"
    )
    return root


def _producer_on(
    lone_node: LocalCluster, tmp_path: Path, settings_env: Callable[..., None], **env: str
) -> None:
    """A producer's settings on the lone node, serving one identity model (`echo`)."""
    settings_env(
        CONVEYOR_REDIS_URL=f"redis://127.0.0.1:{lone_node.masters[0].port}/0",
        CONVEYOR_REDIS_CLUSTER="1",
        CONVEYOR_AUTH="disabled",
        CONVEYOR_MODEL_REPOSITORY=str(_repository(tmp_path / "models")),
        **env,
    )


async def test_a_stopped_producer_leaves_no_connection_of_its_submit_path(
    lone_node: LocalCluster, tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """On a cluster the submit path's group-committing client holds connections of its own,
    which a stopped producer left open (each restart, each app a test built, kept its own)."""
    _producer_on(lone_node, tmp_path, settings_env, CONVEYOR_INSTANCE_ID="closes-hot")
    with lone_node.masters[0].client() as node:

        def held() -> list[str]:
            names = [peer.get("name", "") for peer in node.client_list()]
            return [name for name in names if name == "producer-closes-hot-hot"]

        async with app_client(create_app(get_settings())) as client:
            submitted = await client.post("/v1/jobs", json={"model": "echo", "inputs": {}})
            assert submitted.status_code == 202, submitted.text
            assert held()  # the submit went through it
        assert held() == []


async def test_a_scrape_answers_while_the_cluster_is_gone(
    lone_node: LocalCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings_env: Callable[..., None],
) -> None:
    """The module's last test: it stops the cluster."""
    _producer_on(lone_node, tmp_path, settings_env, CONVEYOR_REDIS_TIMEOUT_S="1")
    async with app_client(create_app(get_settings())) as client:
        assert (await client.get("/metrics")).status_code == 200
        lone_node.masters[0].server.stop()
        for _ in range(2):  # the first read finds the connection lost, the next no node at all
            monkeypatch.setattr(metrics_route, "_last_refresh", 0.0)  # not throttled: read anew
            scrape = await client.get("/metrics")
            assert scrape.status_code == 200, scrape.text
            names = {family.name for family in text_string_to_metric_families(scrape.text)}
            assert "conveyor_http_requests" in names
            backlog = await client.get("/metrics/backlog/echo/default")  # what KEDA reads
            assert backlog.status_code == 503, backlog.text
            assert backlog.headers["retry-after"] == "1"
    # stopped, the producer leaves no reply listener behind: one that had lost its node and
    # was resubscribing elsewhere was no longer the listener's to stop, and retried for good
    assert not [task for task in asyncio.all_tasks() if task.get_name() == "reply-listener"]
