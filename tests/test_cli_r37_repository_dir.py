"""Every command that loads the model repository, run from outside the checkout: the default
CONVEYOR_MODEL_REPOSITORY (`model_repository`) is relative, and the refusal named it so, exit 1,
leaving the user to guess where it looked and what to set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main

COMMANDS = (
    ("autoscale", "--models", "identity", "--state-dir", "autoscale"),
    ("up", "--state-dir", "up"),
    ("render", "keda"),
    ("models", "list"),
    ("models", "prepare"),
)


def _refusals() -> list[tuple[int, str]]:
    return [
        (result.exit_code, result.stderr)
        for result in (CliRunner().invoke(main, list(command)) for command in COMMANDS)
    ]


def test_a_missing_repository_is_named_absolute_with_its_setting(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings_env: Callable[..., None],
) -> None:
    """One line, exit 2 as a usage error, before anything starts (a real Redis to reach)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONVEYOR_MODEL_REPOSITORY", raising=False)
    settings_env(CONVEYOR_REDIS_URL=redis_url)
    relative = (
        f"Error: model repository {tmp_path / 'model_repository'} is not a directory "
        "('model_repository' is relative to this directory): set CONVEYOR_MODEL_REPOSITORY to "
        "your models' folder\n"
    )
    assert _refusals() == [(2, relative)] * len(COMMANDS)
    assert not (tmp_path / "up" / "stack.json").exists()  # nothing started

    settings_env(CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "gone"))
    absolute = (
        f"Error: model repository {tmp_path / 'gone'} is not a directory: set "
        "CONVEYOR_MODEL_REPOSITORY to your models' folder\n"
    )
    assert _refusals() == [(2, absolute)] * len(COMMANDS)


def test_render_names_a_missing_model_repository_option(tmp_path: Path) -> None:
    """`--model-repository` given: its own option is named, not the setting."""
    missing = tmp_path / "gone"
    result = CliRunner().invoke(main, ["render", "keda", "--model-repository", str(missing)])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--model-repository': Directory '{missing}' does not exist." in (
        result.stderr
    )
