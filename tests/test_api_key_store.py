"""The API key store on a real Valkey: a listing holds every key as stored, revoked ones
included, in id order, and a key whose record is gone is left out. A key's tenant and model
names are whole identifiers (they end up in Redis key names)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from shared.api_keys import ApiKeyStore, InvalidKeySpec, KeySpec
from shared.keys import Keys


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
