"""A Redis-backed command (`conveyor keys`, `conveyor dlq`) given a database the server lacks
(`CONVEYOR_REDIS_URL=redis://host:port/99`) ends with one line naming the URL, not a traceback;
an ordinary command error on a usable Redis is still its own line, not "cannot use Redis"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from click.testing import CliRunner, Result
from redis.exceptions import ResponseError

from conveyor.cli import main
from conveyor.local_stack import with_redis
from shared.settings import Settings


@pytest.fixture
def cli(settings_env: Callable[..., None], tmp_path: Path) -> Callable[..., Result]:
    """`conveyor …` run here on CONVEYOR_REDIS_URL=`url` (no `conveyor up` state)."""

    def run(url: str, *args: str) -> Result:
        settings_env(CONVEYOR_REDIS_URL=url, CONVEYOR_STATE_DIR=str(tmp_path))
        return CliRunner().invoke(main, list(args))

    return run


@pytest.mark.parametrize("args", [("keys", "list"), ("dlq", "list", "identity")])
def test_a_database_the_server_lacks_is_one_line(
    cli: Callable[..., Result], redis_url: str, args: tuple[str, ...]
) -> None:
    url = urlsplit(redis_url)._replace(path="/99").geturl()
    result = cli(url, *args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: cannot use Redis at {url} ("), result.output
    assert result.output.count("\n") == 1, result.output


def test_a_command_error_on_a_usable_redis_keeps_its_own_line(
    cli: Callable[..., Result], redis_url: str
) -> None:
    result = cli(redis_url, "keys", "revoke", "not a key id")
    assert result.exit_code == 1, result.output
    assert "Redis" not in result.output and result.output.count("\n") == 1, result.output


def test_a_redis_error_of_the_command_itself_is_not_blamed_on_redis(
    settings_env: Callable[..., None], redis_url: str, tmp_path: Path
) -> None:
    """Redis answers a PING: the command's own error is raised as it was, not "cannot use"."""
    settings_env(CONVEYOR_REDIS_URL=redis_url, CONVEYOR_STATE_DIR=str(tmp_path))

    async def refused(client: aioredis.Redis, _settings: Settings) -> None:
        await client.execute_command("NO-SUCH-COMMAND")

    with pytest.raises(ResponseError, match="unknown command"):
        with_redis(refused)
