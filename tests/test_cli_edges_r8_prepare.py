"""`conveyor models prepare` into an artifact folder that cannot be made ends with one line
naming the model and the folder: it was a FileNotFoundError traceback out of the build lock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from conveyor.cli import main
from tests.conftest import REPO_ROOT


def test_an_artifact_folder_that_cannot_be_made_is_one_line(
    settings_env: Callable[..., None], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"  # a file where a folder must go: refused for root too
    blocker.write_text("")
    artifacts = blocker / "models"
    settings_env(
        CONVEYOR_MODEL_REPOSITORY=str(REPO_ROOT / "model_repository"),
        CONVEYOR_ARTIFACT_DIR=str(artifacts),
    )

    result = CliRunner().invoke(main, ["models", "prepare", "smollm2"])

    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, OSError)
    said, error = result.output.splitlines()  # what it was doing, then why it failed
    assert said == f"preparing smollm2 → {artifacts / 'smollm2'}"
    assert error.startswith(f"Error: cannot prepare smollm2 in {artifacts / 'smollm2'}: ")
    assert "Not a directory" in error
