"""`conveyor keys` and the development key given bad input, on a real Valkey: each mistake is
one clear line with the right exit code, never a traceback, and never repeats a secret. An
operator who held only a leaked key (not its id) pasted it into `keys revoke`, which printed
it back (`no key with id cvk_…`) into the terminal and CI log, and left it working; a chosen
CONVEYOR_DEV_API_KEY that is no key stopped `conveyor up` with a traceback, or (a trailing
newline, as a file or Secret written by `echo` has) was stored as a key no client can send."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
import redis
from click.testing import CliRunner, Result

from conveyor.cli import main
from conveyor.commands.keys import dev_key
from shared.api_keys import key_id_of
from shared.keys import Keys
from shared.settings import Settings
from tests.conftest import issue_key

KEYS = Keys()


@pytest.fixture
def keys_cli(
    redis_url: str,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    tmp_path: Path,
) -> Callable[..., Result]:
    """`conveyor keys …` run here on the test's flushed Valkey (no `conveyor up` state)."""
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_STATE_DIR=str(tmp_path / "state"))

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["keys", *args])

    return run


def test_revoke_takes_the_key_itself_and_never_prints_it(
    keys_cli: Callable[..., Result], redis_url: str, redis_client: redis.Redis
) -> None:
    leaked = issue_key(redis_url, "acme", "read")
    key_id = key_id_of(leaked)
    revoked = keys_cli("revoke", leaked)
    assert revoked.exit_code == 0, revoked.output
    assert revoked.output.strip() == f"revoked {key_id}"
    assert redis_client.hget(KEYS.api_key(key_id), "revoked_at")


@pytest.mark.parametrize(
    "given", ["cvk_never-issued-but-secret-looking-0123456789", "not a key id", ""]
)
def test_revoke_of_no_key_is_one_line_that_never_repeats_it(
    keys_cli: Callable[..., Result], given: str
) -> None:
    refused = keys_cli("revoke", given)
    assert refused.exit_code == 1 and refused.exception is not None
    assert isinstance(refused.exception, SystemExit), refused.exception
    assert refused.output.startswith("Error: ") and len(refused.output.splitlines()) == 1
    if given:
        assert given not in refused.output


def test_revoke_of_an_unknown_id_names_the_id(keys_cli: Callable[..., Result]) -> None:
    refused = keys_cli("revoke", "0123456789abcdef")
    assert refused.exit_code == 1
    assert refused.output == "Error: no key with id 0123456789abcdef\n"


def test_a_lifetime_too_long_for_a_date_is_a_usage_error(keys_cli: Callable[..., Result]) -> None:
    """An `--expires-in` past what a float holds ended `keys create` with OverflowError."""
    refused = keys_cli("create", "--tenant", "acme", "--expires-in", "9" * 320 + "d")
    assert refused.exit_code == 2, refused.output
    assert isinstance(refused.exception, SystemExit), refused.exception
    assert "--expires-in" in refused.output


# (one ending in a newline, a secret file's, the settings refuse: test_settings_r11_whitespace)
@pytest.mark.parametrize("chosen", ["short", "cvk_with a space", "cvk_chosen-with\nnewline"])
def test_a_chosen_dev_key_that_is_no_key_is_one_clear_line(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, chosen: str
) -> None:
    settings = Settings(redis_url=redis_url, dev_api_key=chosen)
    with pytest.raises(click.ClickException, match="CONVEYOR_DEV_API_KEY") as refused:
        dev_key(settings, tmp_path / "dev-key")
    assert chosen.strip() not in refused.value.message
    assert not redis_client.keys(KEYS.api_key("*"))
