"""Dead letters of a partition the model repository no longer has (a model taken out, or a variant
out of its config), on a real Valkey: the console listed only the repository's partitions, so
those letters were reachable from the CLI alone (given their name), and every console action on
them answered 404. The page and `conveyor dlq partitions` list every partition holding letters;
the page says which are no longer served, refuses their replay with a 409 (the letters stay), as
the CLI does, and discards them. Also: a letter whose webhook is no string is kept by a replay,
which it failed (Redis's DataError) with every later letter unreplayed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis
from click.testing import Result

from producer_api.app import create_app
from shared.codec import RequestEntry, as_text
from shared.dead_letters import enlist_lettered
from shared.job_store import now_ms
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests import test_dlq_r11_operator as r11
from tests.app_client import app_client
from tests.test_dlq_r11_operator import dlq, r  # noqa: F401 (fixtures: the CLI in process)

KEYS = Keys("dlq-r23:")
GONE_MODEL = ("gone", "default")  # a model the repository does not have
GONE_VARIANT = ("identity", "retired")  # a variant identity's config does not have


async def _letter(client: aioredis.Redis, model: str, variant: str) -> str:
    """A dead letter as RECLAIM writes it, its partition enlisted as the reclaimer enlists it;
    its DLQ id."""
    entry = RequestEntry(new_job_id(model, variant), {"inputs": {"x": 1}}, now_ms(), tenant="t1")
    fields: dict[Any, Any] = {"entry": "1-0", "lane": KEYS.queue(model, variant), "deliveries": 3}
    fields |= {"reason": "crashed", **entry.encode()}
    await enlist_lettered(client, KEYS, model, variant)
    return as_text(await client.xadd(KEYS.dlq(model, variant), fields))


async def _clean(client: aioredis.Redis) -> None:
    async for key in client.scan_iter(match="dlq-r23*", count=1000):
        await client.delete(key)


async def test_the_page_lists_letters_of_partitions_no_longer_served(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await _clean(aredis)
    for model, variant in (GONE_MODEL, GONE_VARIANT):
        await _letter(aredis, model, variant)
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        page = await client.get("/console/dead-letters")
    assert page.status_code == 200, page.text
    for model, variant in (GONE_MODEL, GONE_VARIANT):
        section = page.text.split(f"<h2>{model}:{variant} ")[1].split("</section>")[0]
        assert "1 entries" in section and "no longer served" in section
        assert "Discard all" in section and "action=replay" not in section  # it would be refused
    assert "unknown model &#39;gone&#39;" in page.text
    assert "model identity has no variant &#39;retired&#39;" in page.text
    served = page.text.split("<h2>identity:default ")[1].split("</section>")[0]
    assert "no longer served" not in served
    await _clean(aredis)


async def test_a_replay_of_an_unserved_partition_is_refused_and_its_letter_kept(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await _clean(aredis)
    dlq_id = await _letter(aredis, *GONE_VARIANT)
    partition = ":".join(GONE_VARIANT)
    settings = Settings(redis_url=redis_url, key_prefix=KEYS.prefix, auth="disabled")
    async with app_client(create_app(settings)) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/console")).text)
        assert csrf is not None
        confirm = "/console/dead-letters/confirm"
        form = {"partition": partition, "entry": dlq_id, "csrf": csrf[1]}
        refused: list[httpx.Response] = [
            await client.get(confirm, params={"action": "replay", "partition": partition}),
            await client.post("/console/dead-letters/replay", data=form),
        ]
        for answer in refused:
            assert answer.status_code == 409, answer.text
            message = answer.json()["error"]["message"]
            assert message.startswith(f"cannot replay {partition}: no longer served"), message
        assert await aredis.xlen(KEYS.dlq(*GONE_VARIANT)) == 1  # kept
        assert await aredis.xlen(KEYS.queue(*GONE_VARIANT)) == 0
        asked = await client.get(confirm, params={"action": "discard", "partition": partition})
        assert asked.status_code == 200 and "Discard 1 dead letter of" in asked.text
        discarded = await client.post("/console/dead-letters/discard", data=form)
        assert discarded.status_code == 200, discarded.text
        assert await aredis.xlen(KEYS.dlq(*GONE_VARIANT)) == 0
        # its stream stays, empty: the page lists the partitions that hold letters
        assert f"<h2>{partition} " not in (await client.get("/console/dead-letters")).text
        # a partition neither served nor holding any key (a typo) is still unknown
        typo = await client.get(confirm, params={"action": "discard", "partition": "gone:typo"})
        assert typo.status_code == 404, typo.text


def test_a_partition_a_reclaim_dead_lettered_is_listed(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
    redis_url: str,
) -> None:
    """The reclaimer that dead-letters a job enlists its partition (a model no repository has
    here), which `partitions` then names with its count."""
    asyncio.run(r11._died_in_a_worker(redis_url, "doomed-r23"))
    listed = dlq("partitions")
    assert listed.exit_code == 0, (listed.output, listed.exception)
    assert listed.stdout == f"{r11.MODEL}:default\t1\n"


def test_the_cli_refuses_a_replay_into_a_variant_no_longer_served(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
) -> None:
    """A variant taken out of its model's config (its model still served) is refused as a model
    taken out is, naming the variant, and its letter stays to be listed and purged."""
    entry = RequestEntry(new_job_id("faulty", "retired"), {"inputs": {"x": 1}}, now_ms())
    fields: dict[Any, Any] = {"entry": "1-0", "reason": "crashed", "deliveries": 3}
    dlq_id = str(r.xadd(r11.KEYS.dlq("faulty", "retired"), fields | entry.encode()))
    refused = dlq("replay", "faulty", "--variant", "retired")
    assert refused.exit_code == 1, refused.output
    assert "cannot replay faulty:retired: model faulty has no variant 'retired'" in refused.output
    assert r.xlen(r11.KEYS.dlq("faulty", "retired")) == 1
    assert r.xlen(r11.KEYS.queue("faulty", "retired")) == 0
    assert dlq("list", "faulty", "--variant", "retired").output.startswith(f"{dlq_id}\t")
    assert dlq("purge", "faulty", "--variant", "retired", "--id", dlq_id).output == "purged 1\n"


def test_a_letter_whose_webhook_is_no_string_is_kept_not_a_failed_replay(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
) -> None:
    """A letter whose payload's webhook is no URL string (written by hand, or damaged): with no
    webhook policy here to check it, the replay handed it to Redis, which refused it
    (`DataError`), ending the replay with every later letter left unreplayed."""
    dlq_ids: list[str] = []
    for hook in ({"url": "https://x.example.com"}, True, None):
        payload: dict[str, Any] = {"inputs": {}} | ({} if hook is None else {"webhook": hook})
        entry = RequestEntry(new_job_id("faulty", "default"), payload, now_ms())
        fields: dict[Any, Any] = {"entry": "1-0", "reason": "crashed", "deliveries": 3}
        dlq_ids.append(str(r.xadd(r11.KEYS.dlq("faulty", "default"), fields | entry.encode())))
    replayed = dlq("replay", "faulty")
    assert replayed.exit_code == 0, (replayed.output, replayed.exception)
    for dlq_id in dlq_ids[:2]:
        assert f"(dead letter {dlq_id}): webhook_refused: webhook: not a string" in replayed.output
    assert "replayed 1, kept 2" in replayed.output
    assert r.xlen(r11.KEYS.queue("faulty", "default")) == 1
    rows: Any = r.xrange(r11.KEYS.dlq("faulty", "default"))
    assert [dlq_id for dlq_id, _ in rows] == dlq_ids[:2]


def test_the_cli_names_every_partition_holding_letters(
    r: redis.Redis,  # noqa: F811
    dlq: Callable[..., Result],  # noqa: F811
) -> None:
    """`list`, `replay` and `purge` take a partition's name, which nothing gave for a model
    taken out of the repository; `partitions` names those holding letters, served or not."""
    fields: dict[Any, Any] = {"entry": "1-0", "reason": "crashed", "deliveries": 3}
    for model, variant in (("gone", "default"), ("faulty", "default"), ("faulty", "retired")):
        r.sadd(r11.KEYS.lettered, f"{model}:{variant}")  # as the reclaimer enlists them
    r.sadd(r11.KEYS.lettered, "odd:default", "no partition")
    for model, variant, letters in (("gone", "default", 2), ("faulty", "default", 1)):
        for _ in range(letters):
            entry = RequestEntry(new_job_id(model, variant), {"inputs": {}}, now_ms())
            r.xadd(r11.KEYS.dlq(model, variant), fields | entry.encode())
    emptied = r.xadd(r11.KEYS.dlq("faulty", "retired"), fields)  # its letters all purged
    r.xdel(r11.KEYS.dlq("faulty", "retired"), emptied)
    r.set(r11.KEYS.dlq("odd", "default"), "by hand")
    listed = dlq("partitions")
    assert listed.exit_code == 0, (listed.output, listed.exception)
    assert listed.stdout == "faulty:default\t1\ngone:default\t2\n"
    assert "odd:default: " in listed.stderr and "is a string, not a stream" in listed.stderr
