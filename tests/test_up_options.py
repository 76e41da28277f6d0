"""`conveyor up`'s options refused as usage errors (exit 2) before anything starts or is
written: an empty `--state-dir` (a script's unset variable) made the current directory the
state dir, and filled it with the stack's lock, logs, Valkey data and development key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.commands import up
from tests.conftest import REPO_ROOT


def test_an_empty_state_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings_env: Callable[..., None]
) -> None:
    monkeypatch.chdir(tmp_path)
    settings_env(  # were it let through, it stops at the Redis that does not answer
        CONVEYOR_MODEL_REPOSITORY=str(REPO_ROOT / "model_repository"),
        CONVEYOR_REDIS_URL="redis://127.0.0.1:1/0",
    )
    result = CliRunner().invoke(up.command, ["--models", "identity", "--state-dir", ""])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--state-dir': '' is empty" in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # no lock, no log, in the current directory


def test_a_repository_without_models_is_refused_before_anything_starts(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """Its producers are never ready (`/readyz`: no models in the repository): `up` started
    Valkey and the producers, then waited out CONVEYOR_START_TIMEOUT_S (5 minutes) in silence."""
    repository, state_dir = tmp_path / "repository", tmp_path / "run"
    repository.mkdir()  # a path that names some other folder, say the checkout's parent
    settings_env(  # were it let through, it stops at the Redis that does not answer
        CONVEYOR_MODEL_REPOSITORY=str(repository), CONVEYOR_REDIS_URL="redis://127.0.0.1:1/0"
    )
    result = CliRunner().invoke(up.command, ["--state-dir", str(state_dir)])
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"Error: the model repository {repository} has no models (a folder with a "
        "config.yaml each): check CONVEYOR_MODEL_REPOSITORY\n"
    )
    assert not state_dir.exists()
