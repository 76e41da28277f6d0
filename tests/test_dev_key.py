"""The development key `conveyor up` prints, on a real Valkey: one chosen by
CONVEYOR_DEV_API_KEY and then revoked (it leaked) used to be stored afresh, revocation gone, by
the next `conveyor up` with the same setting. The file the key is kept in is its owner's
alone, though it was there before with wider permissions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import pytest

from conveyor.commands.keys import dev_key, dev_key_spec
from shared.api_keys import ApiKey, ApiKeyStore, key_id_of
from shared.keys import Keys
from shared.redis_client import connect
from shared.settings import Settings

CHOSEN = "cvk_chosen-for-the-scripts"


def _on_store(redis_url: str, action: str) -> ApiKey | None:
    """Create and revoke the chosen key (`revoked`), or read its record (`read`)."""

    async def act() -> ApiKey | None:
        client = connect(redis_url, blocks_ms=0)
        try:
            store = ApiKeyStore(client, Keys())
            if action == "revoked":
                await store.create(dev_key_spec(), CHOSEN)
                await store.revoke(key_id_of(CHOSEN))
            return await store.verify(CHOSEN)
        finally:
            await client.aclose()

    return asyncio.run(act())


def test_a_revoked_chosen_key_is_not_brought_back(redis_url: str, tmp_path: Path) -> None:
    _on_store(redis_url, "revoked")
    settings = Settings(redis_url=redis_url, dev_api_key=CHOSEN)
    with pytest.raises(click.ClickException, match="was revoked"):
        dev_key(settings, tmp_path / "dev-key")
    record = _on_store(redis_url, "read")
    assert record is not None and record.revoked_at


def test_the_key_file_is_made_owner_only_though_it_existed(redis_url: str, tmp_path: Path) -> None:
    """`touch(mode=0o600)` sets a mode only on a file it creates: a key file left readable by
    everyone (an older run, a copy) kept the admin key readable by everyone."""
    key_file = tmp_path / "dev-key"
    key_file.write_text("")
    key_file.chmod(0o644)
    key = dev_key(Settings(redis_url=redis_url), key_file)
    assert key_file.read_text() == key + "\n"
    assert key_file.stat().st_mode & 0o777 == 0o600
