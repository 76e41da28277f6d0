"""Every loader of the model repository refuses a `queue.max_queue_time_s` past
CONVEYOR_RESULT_TTL_S, not only those that passed the TTL: `conveyor up` started a stack on a
config its producer then refused at every start (a crash loop), and `conveyor render keda`
rendered autoscaling for it. Plain uvicorn refuses it in one line too, not amid Starlette's
lifespan traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main


def _repository(root: Path) -> Path:
    """A repository whose one model may wait 600 s in its queue."""
    config = root / "m" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("kind: batch\nbackend: identity\nqueue: {max_queue_time_s: 600}\n")
    return config


def _refusal(config: Path) -> str:
    return (
        f"Error: {config}: queue.max_queue_time_s (600.0 s) must be below "
        "CONVEYOR_RESULT_TTL_S (300 s): a job's hash expires that long after it was enqueued, "
        "even while it waits\n"
    )


@pytest.mark.parametrize("command", [["up"], ["render", "keda", "--out", "-"]])
def test_a_queue_wait_past_the_result_ttl_stops_every_command_at_once(
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    command: list[str],
) -> None:
    config = _repository(tmp_path / "repo")
    monkeypatch.delenv("CONVEYOR_REDIS_URL", raising=False)
    settings_env(
        CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repo"),
        CONVEYOR_STATE_DIR=str(tmp_path / "state"),
        CONVEYOR_RESULT_TTL_S="300",
        # a guard: `conveyor up` past the repository stops at this refusal, starting nothing
        CONVEYOR_REDIS_CLUSTER="true",
    )

    result = CliRunner().invoke(main, command)

    assert result.exit_code == 1, result.output
    assert result.output == _refusal(config)
    assert not (tmp_path / "state").exists()


def test_uvicorn_refuses_the_repository_in_one_line(tmp_path: Path) -> None:
    """`uvicorn producer_api.app:app`, uvicorn's own command line (README names it)."""
    config = _repository(tmp_path / "repo")
    env = {
        **os.environ,
        "CONVEYOR_MODEL_REPOSITORY": str(tmp_path / "repo"),
        "CONVEYOR_RESULT_TTL_S": "300",
    }
    uvicorn = Path(sys.executable).parent / "uvicorn"

    ended = subprocess.run(
        [str(uvicorn), "producer_api.app:app", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert ended.returncode != 0
    assert ended.stdout + ended.stderr == _refusal(config)
