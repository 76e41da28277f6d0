"""`conveyor keys create` given odd input, on a real Valkey: an `--expires-in` of more digits
than Python parses into an int ended `create` with a ValueError traceback, and a `--name` with a
tab or a newline was stored as given, so `keys list` printed a line of extra columns, or a second
line that reads as another key. A development key chosen as 16 hex digits (`openssl rand -hex
8`) looked like a key id to `keys revoke`, which then printed the key back (`no key with id …`)
and left it working."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import Result

from conveyor.commands.keys import dev_key
from shared.api_keys import key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests import test_keys_cli

KEYS = Keys()
keys_cli = test_keys_cli.keys_cli  # `conveyor keys …` on the test's flushed Valkey


def test_a_lifetime_of_more_digits_than_an_int_parses_is_a_usage_error(
    keys_cli: Callable[..., Result],
) -> None:
    refused = keys_cli("create", "--tenant", "acme", "--expires-in", "9" * 5000 + "s")
    assert refused.exit_code == 2, refused.output
    assert isinstance(refused.exception, SystemExit), refused.exception
    assert "--expires-in" in refused.output


@pytest.mark.parametrize("name", ["team\tb", "ci\n0123456789abcdef\tacme\tadmin", "bell\x07"])
def test_a_name_that_would_break_the_listing_is_refused(
    keys_cli: Callable[..., Result], redis_client: redis.Redis, name: str
) -> None:
    refused = keys_cli("create", "--tenant", "acme", "--name", name)
    assert refused.exit_code == 2, refused.output
    assert "name" in refused.output
    assert not redis_client.keys(KEYS.api_key("*"))


def test_a_name_of_words_is_listed_on_one_line(keys_cli: Callable[..., Result]) -> None:
    created = keys_cli("create", "--tenant", "acme", "--name", "nightly ETL (ü)")
    assert created.exit_code == 0, created.output
    listed = keys_cli("list")
    assert listed.output.count("\n") == 1 and listed.output.endswith("\tnightly ETL (ü)\n")


def test_a_key_of_16_hex_digits_is_revoked_by_the_key_itself(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    chosen = "0123456789abcdef"
    dev_key(Settings(redis_url=redis_url, dev_api_key=chosen), tmp_path / "dev-key")
    revoked = keys_cli("revoke", chosen)
    assert revoked.exit_code == 0, revoked.output
    assert revoked.output == f"revoked {key_id_of(chosen)}\n"
    assert redis_client.hget(KEYS.api_key(key_id_of(chosen)), "revoked_at")
