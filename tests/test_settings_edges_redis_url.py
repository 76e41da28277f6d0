"""A CONVEYOR_REDIS_URL redis-py cannot use (a port or database that is no number, a port out of
range) is refused when the settings load, by name, in one line: before, only its scheme was
checked, and every Redis-backed command ended in redis-py's ValueError traceback (or, for a
database path that is no number, quietly used database 0)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from conveyor.cli import main
from shared.settings import Settings, bad_setting

MALFORMED = [
    "redis://h:notaport/0",
    "redis://h:99999",
    "redis://h:0",  # no server listens on port 0
    "redis://h/notadb",  # redis-py drops the path in silence: database 0
    "redis://h/1/2",  # read as database 12
    "redis://h/-1",
    "redis://h?db=x",
    "redis://h?db=-1",
    "rediss://h?socket_timeout=soon",
    "unix:///run/valkey.sock?db=x",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_a_redis_url_redis_py_cannot_use_is_a_bad_setting(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url=url)
    line = bad_setting(refused.value)
    assert line.startswith(f"bad setting: CONVEYOR_REDIS_URL={url!r}: "), line
    assert "\n" not in line, line


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://h",
        "redis://h/",
        "rediss://user:pw@h:6380/3?socket_timeout=2",
        "redis://h?db=4",
        "redis://[::1]:7000",
        "unix:///run/valkey.sock?db=2",
    ],
)
def test_a_usable_redis_url_is_kept(url: str) -> None:
    assert Settings(redis_url=url).redis_url == url


def test_the_password_of_a_refused_url_is_not_echoed() -> None:
    """The line goes to a terminal or a pod's log: the URL's password must not be in it."""
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url="redis://app:s3cret@h:port/0")
    line = bad_setting(refused.value)
    assert "s3cret" not in line and "CONVEYOR_REDIS_URL='redis://app:***@h:port/0'" in line, line


@pytest.mark.parametrize("nodes", ["n1:7000,n2:99999", "n1:7000,n2:x"])
def test_a_cluster_seed_with_a_port_out_of_range_is_a_bad_setting(nodes: str) -> None:
    with pytest.raises(ValidationError, match="is no host:port"):
        Settings(redis_cluster_nodes=nodes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args",
    [
        ("render", "keda"),
        ("dlq", "list", "identity"),
        ("keys", "list"),
        ("autoscale", "--models", "identity", "--state-dir", "{tmp}"),
    ],
)
def test_each_redis_command_refuses_a_malformed_url_in_one_line(
    settings_env: Callable[..., None], tmp_path: Path, args: tuple[str, ...]
) -> None:
    settings_env(CONVEYOR_REDIS_URL="redis://h:notaport/0", CONVEYOR_STATE_DIR=str(tmp_path))
    result = CliRunner().invoke(main, [arg.format(tmp=tmp_path) for arg in args])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: bad setting: CONVEYOR_REDIS_URL="), result.output
    assert result.output.count("\n") == 1 and result.exception is not None, result.output
    assert isinstance(result.exception, SystemExit), result.exception


@pytest.mark.parametrize("url", ["redis://h:7000/3", "redis://h:7000?db=1"])
def test_a_cluster_url_naming_a_database_other_than_0_is_a_bad_setting(url: str) -> None:
    """redis-py's RedisCluster refuses it as each process connects: a traceback from each."""
    with pytest.raises(ValidationError) as refused:
        Settings(redis_url=url, redis_cluster=True)
    line = bad_setting(refused.value)
    assert line.startswith("bad setting: CONVEYOR_REDIS_CLUSTER=True: "), line
    assert "database 0" in line, line
    assert Settings(redis_url=url).redis_url == url  # one server has the database
    assert Settings(redis_url="redis://h:7000/0", redis_cluster=True).redis_cluster


def test_a_cluster_command_refuses_a_database_other_than_0_in_one_line(
    settings_env: Callable[..., None], tmp_path: Path
) -> None:
    settings_env(
        CONVEYOR_REDIS_URL="redis://127.0.0.1:1/3",
        CONVEYOR_REDIS_CLUSTER="1",
        CONVEYOR_STATE_DIR=str(tmp_path),
    )
    result = CliRunner().invoke(main, ["keys", "list"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: bad setting: CONVEYOR_REDIS_CLUSTER="), result.output
    assert result.output.count("\n") == 1, result.output
