"""An Idempotency-Key's claim is judged abandoned on Redis's clock, on a real Valkey: each
producer stamped a claim with its own wall clock and judged another's by its own, so two
producers whose clocks differed by a minute took a live claim over (a second job) or never took
a dead one over (409 until the key expired). A producer's clock is this process's `time.time`
and `time.time_ns` here (`_read_off`), whichever admission would read: its own `time` or Redis's
clock as a host reads it (`now_ms`); a fake `admission.time` alone reached no code once admission
read no wall clock, and let a claim judged by `now_ms` pass. And a batch create whose claim a
retry took over while it ran (its producer stalled) withdraws its batch."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from producer_api.app import create_app
from producer_api.errors import ConveyorError
from producer_api.jobs import admission
from producer_api.jobs.admission import BodyPrint, Claim, IdempotencyKeys
from shared.api_keys import ApiKeyStore, KeySpec
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import until_async
from tests.test_clock_r38_sweep import _read_off

KEYS = Keys("idem-r28:")
TENANT, BODY = "acme", BodyPrint("fingerprint")
SKEW_S = 120.0  # two producers' clocks this far apart: twice ABANDONED_AFTER_S


async def _never(job_id: str) -> bool:
    return False  # the claimed job never appears: its submit is still enqueueing, or died


async def _redis_ms(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return seconds * 1000 + micros // 1000


@pytest.fixture
def keys(aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch) -> IdempotencyKeys:
    monkeypatch.setattr(admission, "IN_PROGRESS_WAIT_S", 0.3)
    return IdempotencyKeys(aredis, KEYS, 60)


@pytest.mark.parametrize(("claimer_skew_s", "retry_skew_s"), [(-SKEW_S, 0.0), (0.0, SKEW_S)])
async def test_a_live_claim_is_not_taken_over_whatever_the_producers_clocks(
    keys: IdempotencyKeys,
    aredis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    claimer_skew_s: float,
    retry_skew_s: float,
) -> None:
    """A first try claims the key on one producer; its retry, at once, on another whose clock
    is SKEW_S ahead of the first's: the claim read two minutes old, was taken over, and the
    retry enqueued a second job beside the first try's."""
    _read_off(monkeypatch, claimer_skew_s)
    first = new_job_id("m", "default")
    assert await keys.claim(TENANT, "live", first, BODY, _never) is None

    _read_off(monkeypatch, retry_skew_s)
    with pytest.raises(ConveyorError) as waited:  # still being enqueued: retry later
        await keys.claim(TENANT, "live", new_job_id("m", "default"), BODY, _never)
    assert waited.value.status == 409 and waited.value.headers == {"Retry-After": "1"}
    held = Claim.parse(await aredis.get(keys._key(TENANT, "live")) or b"")
    assert held.job_id == first
    assert abs(held.made_ms - await _redis_ms(aredis)) < 5_000  # Redis's time, not a producer's


async def test_a_dead_claim_is_taken_over_by_a_producer_whose_clock_is_behind(
    keys: IdempotencyKeys, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim made 61 s ago on Redis's clock, as an older release wrote it (its producer's
    ms, that clock right), and never followed by its job: a retry on a producer whose clock is
    SKEW_S behind read it from the future, never abandoned, and answered 409 until the key
    expired."""
    dead = Claim(new_job_id("m", "default"), BODY.value, await _redis_ms(aredis) - 61_000)
    await aredis.set(keys._key(TENANT, "dead"), dead.value(), ex=600)
    _read_off(monkeypatch, -SKEW_S)
    retry = new_job_id("m", "default")
    assert await keys.claim(TENANT, "dead", retry, BODY, _never) is None  # taken over
    assert Claim.parse(await aredis.get(keys._key(TENANT, "dead")) or b"").job_id == retry


async def test_a_renewal_stamps_redis_time(
    keys: IdempotencyKeys, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create that keeps its claim young (`kept`) renewed it with its producer's time: from a
    clock behind, each renewal made the claim look older, and another producer took it over
    while the create ran."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", 0.2)  # renewed every 0.05 s
    _read_off(monkeypatch, -SKEW_S)
    creating = f"batch_{new_job_id('m', 'default')}"
    assert await keys.claim(TENANT, "kept", creating, BODY, _never) is None
    async with keys.kept(TENANT, "kept", creating, BODY):
        await aredis.set(keys._key(TENANT, "kept"), Claim(creating, BODY.value, 1).value())

        async def renewed_since() -> Claim | None:
            claim = Claim.parse(await aredis.get(keys._key(TENANT, "kept")) or b"")
            return claim if claim.made_ms != 1 else None

        # waited for, not slept to: a renewal late on a loaded machine left the claim unrenewed
        renewed = await until_async(renewed_since, timeout=30, every=0.01)
    assert renewed.job_id == creating
    assert abs(renewed.made_ms - await _redis_ms(aredis)) < 5_000


async def test_a_batch_create_whose_claim_was_taken_over_withdraws_its_batch(
    redis_url: str, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create's claim is taken over while it enqueues its lines, as a retry on another
    producer takes over the claim of one stalled past ABANDONED_AFTER_S (written here as that
    take-over writes it): the create went on, answered 202 and ran a second batch of the same
    lines beside the retry's. It withdraws its batch and answers 409 with Retry-After, which
    the SDK retries, for the batch the key names."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", 0.2)  # renewed every 0.05 s
    spec = KeySpec(tenant=TENANT, scopes=frozenset({"submit", "read"}))
    api_key, _ = await ApiKeyStore(aredis, KEYS).create(spec)
    auth = {"Authorization": f"Bearer {api_key}"}
    headers = {**auth, "Content-Type": "application/jsonl", "Idempotency-Key": "stalled"}
    source = "".join(  # enough lines to keep the create busy several renewals long
        json.dumps({"custom_id": f"c{i}", "body": {"inputs": {"n": i}}}) + "\n"
        for i in range(3_000)
    ).encode()
    claim_key = IdempotencyKeys(aredis, KEYS, 60)._key(TENANT, "stalled")
    app = create_app(Settings(redis_url=redis_url, key_prefix=KEYS.prefix))
    async with app_client(app) as client:
        create = asyncio.create_task(
            client.post(
                "/v1/batches", params={"model": "identity"}, content=source, headers=headers
            )
        )
        while (held := await aredis.get(claim_key)) is None:
            await asyncio.sleep(0.002)
        first = Claim.parse(held)
        retry = Claim(f"batch_{new_job_id('m', 'default')}", first.fingerprint, first.made_ms)
        await aredis.set(claim_key, retry.value())
        answer = await create

        async def ended() -> dict[str, Any] | None:
            """The withdrawn batch once it has ended: the end it asked for is written by its
            sweep, which may still be `finalizing` it when the 409 has gone out (it was, under
            load)."""
            batch = (await client.get(f"/v1/batches/{first.job_id}", headers=auth)).json()
            return batch if batch["status"] != "finalizing" else None

        withdrawn = await until_async(ended, timeout=60)
    assert answer.status_code == 409, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert withdrawn["status"] == "cancelled", withdrawn
    assert Claim.parse(await aredis.get(claim_key) or b"").job_id == retry.job_id  # the retry's


async def test_a_take_over_during_a_stall_at_the_end_of_a_create_is_seen(
    keys: IdempotencyKeys, aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer that stalls (its loop blocked) as its create ends runs no renewal in between:
    the renewal overdue then is made as the claim is let go, and finds the retry's claim."""
    monkeypatch.setattr(admission, "ABANDONED_AFTER_S", 0.2)
    creating = f"batch_{new_job_id('m', 'default')}"
    assert await keys.claim(TENANT, "stall", creating, BODY, _never) is None
    retry = Claim(f"batch_{new_job_id('m', 'default')}", BODY.value, await _redis_ms(aredis))
    async with keys.kept(TENANT, "stall", creating, BODY) as hold:
        await aredis.set(keys._key(TENANT, "stall"), retry.value())  # taken over meanwhile
        time.sleep(0.15)  # the stall: the loop runs nothing, renewals included
    assert hold.lost
