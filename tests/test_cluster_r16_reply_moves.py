"""The reply listener on a real Valkey Cluster while it moves a channel off a node. When the
node drops its connection, every waiter is rechecked once the channel is subscribed again, so a
reply published in the gap (lost: pub/sub is not stored) never leaves a long-poll sitting out
its whole wait. A channel subscribed through a stale topology (a slot just moved) is followed
to the slot's new master."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.crc import key_slot

from conveyor.valkey_cluster import LocalCluster
from producer_api.reply_listener import ReplyListener
from shared.codec import dumps
from shared.job_store import JobStore
from shared.keys import Keys, new_job_id
from shared.redis_client import connect
from tests.conftest import until_async

pytestmark = pytest.mark.slow
KEYS = Keys()


async def test_a_waiter_on_a_channel_moved_off_its_node_is_rechecked(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> None:
    """The channel's node drops the listener's connection after the job ended, its reply never
    heard: the listener subscribes the channel again and reads the job, waking its waiter."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    client = connect(f"redis://127.0.0.1:{cluster.masters[0].port}/0")
    await client.ping()  # knows the slots, as a producer's does once started
    listener = ReplyListener(client, KEYS, "p1", JobStore(client, KEYS, 60))
    try:
        job_id = new_job_id("identity", "default")
        waiting = await listener.register(job_id)
        # the job ends, its reply never heard
        await client.hset(
            KEYS.job(job_id),
            mapping={"status": "succeeded", "model": "m", "variant": "default", "outputs": "{}"},
        )
        with cluster.master_of(listener.channel(job_id)).client() as node:
            for peer in node.client_list():
                if peer.get("ssub") == "1":
                    node.client_kill_filter(_id=peer["id"])
        assert (await asyncio.wait_for(waiting, 10))["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()


async def test_a_channel_subscribed_where_its_slot_was_is_followed_to_its_new_master(
    cluster: LocalCluster, settings_env: Callable[..., None]
) -> None:
    """A waiter that follows its channel while the listener's topology is stale (a slot just
    moved, as during a resubscription) subscribes on the old master, which answers MOVED: the
    listener subscribes it where the slot lives now, and hears its reply there."""
    settings_env(CONVEYOR_REDIS_CLUSTER="1")
    client = connect(f"redis://127.0.0.1:{cluster.masters[0].port}/0")
    await client.ping()  # the slots known before the move
    listener = ReplyListener(client, KEYS, "p1", JobStore(client, KEYS, 60))
    try:
        job_id = new_job_id("identity", "canary")  # a slot with no key
        channel = listener.channel(job_id)
        source = cluster.master_of(channel)
        target = next(node for node in cluster.masters if node.port != source.port)
        slot, target_id = key_slot(channel.encode()), target.client().cluster("MYID")
        for node in (target, source):  # an empty slot: handed over without MIGRATE
            node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        waiting = await listener.register(job_id)
        with target.client() as owner:

            async def resubscribed() -> bool:
                [(_, count)] = owner.pubsub_shardnumsub(channel)
                return bool(count == 1)

            await until_async(resubscribed, timeout=10)
            view = {"id": job_id, "status": "succeeded"}
            assert owner.execute_command("SPUBLISH", channel, dumps([view])) == 1
        assert (await asyncio.wait_for(waiting, 10))["status"] == "succeeded"
    finally:
        await listener.stop()
        await client.aclose()
