"""An empty `CONVEYOR_*` path or host (a script's unset variable, `X=""` in an env file) is
refused by name: `CONVEYOR_STATE_DIR=""` was the current directory, which got `conveyor up`'s
lock, logs and Valkey data, and `CONVEYOR_HOST=""` bound every interface, not loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from conveyor.cli import main
from shared.settings import Settings, bad_setting

EMPTY_REFUSED = (
    "CONVEYOR_STATE_DIR",
    "CONVEYOR_MODEL_REPOSITORY",
    "CONVEYOR_ARTIFACT_DIR",
    "CONVEYOR_HOST",
)


@pytest.mark.parametrize("name", EMPTY_REFUSED)
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_path_or_host_is_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = bad_setting(refused.value)
    assert line.startswith(f"bad setting: {name}={value!r}: "), line
    assert "empty" in line and "\n" not in line, line


def test_conveyor_up_with_an_empty_host_stops_with_one_line(
    settings_env: Callable[..., None], tmp_path: object
) -> None:
    """Before anything starts: the one line names the variable. (A Redis that does not answer:
    what `up` would start, were the host let through, stops there.)"""
    settings_env(
        CONVEYOR_HOST="",
        CONVEYOR_STATE_DIR=str(tmp_path),
        CONVEYOR_REDIS_URL="redis://127.0.0.1:1/0",
    )
    result = CliRunner().invoke(main, ["up", "--models", "identity"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: bad setting: CONVEYOR_HOST='': "), result.output
    assert result.output.count("\n") == 1, result.output
