"""`conveyor models list|prepare` load the repository as the producer and the workers do,
CONVEYOR_RESULT_TTL_S included: a `queue.max_queue_time_s` past it was listed as a servable
model while both refused to start on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main


@pytest.mark.parametrize("command", [["list"], ["prepare", "m"]])
def test_a_queue_wait_past_the_result_ttl_is_refused_by_the_cli(
    settings_env: Callable[..., None], tmp_path: Path, command: list[str]
) -> None:
    config = tmp_path / "repo" / "m" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("kind: batch\nbackend: identity\nqueue: {max_queue_time_s: 600}\n")
    settings_env(
        CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repo"),
        CONVEYOR_ARTIFACT_DIR=str(tmp_path / "artifacts"),
        CONVEYOR_RESULT_TTL_S="300",
    )

    result = CliRunner().invoke(main, ["models", *command])

    assert result.exit_code == 1, result.output
    assert result.output.startswith(
        f"Error: {config}: queue.max_queue_time_s (600.0 s) must be below "
        "CONVEYOR_RESULT_TTL_S (300 s)"
    )
    assert len(result.output.splitlines()) == 1
