"""The API key store on a real Valkey: a listing holds every key as stored, revoked ones
included, in id order, and a key whose record is gone is left out. A key's tenant and model
names are whole identifiers (they end up in Redis key names), and its bucket one Redis can keep
(a rate of 1e-16/s was stored, and every request of the key was then a 500)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.api_keys import MAX_BURST, MIN_RATE_PER_S, ApiKeyStore, InvalidKeySpec, KeySpec
from shared.keys import Keys
from shared.rate_limit import Quota, RateLimiter


async def test_the_listing_holds_every_key_as_stored(aredis: aioredis.Redis) -> None:
    keys = Keys()
    store = ApiKeyStore(aredis, keys)
    specs = [
        KeySpec("acme", frozenset({"submit"}), frozenset({"identity"}), name="a"),
        KeySpec("globex", frozenset({"read"}), name="b", max_in_flight=3, weight=2.0),
        KeySpec("initech", frozenset({"admin"}), name="c"),
    ]
    created = [record for _, record in [await store.create(spec) for spec in specs]]
    assert await store.revoke(created[1].key_id)
    gone = created[2]
    await aredis.delete(keys.api_key(gone.key_id))  # indexed, record gone
    listed = await store.list()
    assert [record.key_id for record in listed] == sorted(r.key_id for r in created[:2])
    by_id = {record.key_id: record for record in listed}
    for record in created[:2]:
        assert by_id[record.key_id].spec == record.spec
        assert by_id[record.key_id].digest == record.digest
    assert by_id[created[0].key_id].revoked_at == 0
    assert by_id[created[1].key_id].revoked_at > 0


@pytest.mark.parametrize("spec", [{"tenant": "acme\n"}, {"tenant": "acme", "models": {"m\n"}}])
def test_a_name_with_a_trailing_newline_is_refused(spec: dict[str, object]) -> None:
    """`$` matches before a final newline: `acme\\n` passed as a tenant of its own."""
    with pytest.raises(InvalidKeySpec):
        KeySpec(scopes=frozenset({"submit"}), **spec).check()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"rate_per_s": 1e-16}, "at least 1e-06"),
        ({"burst": 10**16}, "at most 1,000,000,000"),
    ],
)
async def test_a_bucket_redis_cannot_keep_is_refused_at_creation(
    aredis: aioredis.Redis, limits: dict[str, float], problem: str
) -> None:
    store = ApiKeyStore(aredis, Keys())
    with pytest.raises(InvalidKeySpec, match=problem):
        await store.create(KeySpec("acme", frozenset({"read"}), **limits))  # type: ignore[arg-type]
    assert await store.list() == []


async def test_the_widest_bucket_a_key_may_have_counts_true(aredis: aioredis.Redis) -> None:
    """The bounds themselves work on Redis: the slowest rate's Retry-After is its whole wait,
    the largest burst loses no token to rounding."""
    limiter = RateLimiter(aredis, Keys())
    slowest = Quota(MIN_RATE_PER_S, 1, max_in_flight=1, max_streams=1)
    assert (await limiter.take("slowest", slowest)).allowed
    refused = await limiter.take("slowest", slowest)
    assert not refused.allowed and refused.retry_after_s == 1_000_000
    largest = Quota(MIN_RATE_PER_S, MAX_BURST, max_in_flight=1, max_streams=1)
    taken = [await limiter.take("largest", largest) for _ in range(2)]
    assert [state.remaining for state in taken] == [MAX_BURST - 1, MAX_BURST - 2]
