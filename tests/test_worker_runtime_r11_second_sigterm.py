"""A second SIGTERM stops a draining worker at once, as a second Ctrl-C stops a Celery worker."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from conveyor.stack import Stack
from tests.conftest import REPO_ROOT, until

# A drain held up for good: the engine's close outlasts any grace.
ENGINE = """
import time

from workers.engines.base import BatchEngine


class StuckEngine(BatchEngine):
    def load(self) -> None:
        pass

    def infer(self, inputs):
        return inputs

    def close(self) -> None:
        time.sleep(600)
"""


def test_a_second_sigterm_ends_a_drain_at_once(tmp_path: Path, redis_url: str) -> None:
    """Celery ignores every SIGTERM after the first: the worker ran out its whole grace (here
    ten minutes) whatever was sent to it after."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "stuck_engine.py").write_text(ENGINE)
    (tmp_path / "repository" / "stuck").mkdir(parents=True)
    (tmp_path / "repository" / "stuck" / "config.yaml").write_text(
        "kind: batch\nbackend: stuck_engine:StuckEngine\ninput_schema: {type: object}\n"
    )
    stack = Stack.create(tmp_path, redis_url)
    try:
        name = stack.spawn_worker(
            "stuck",
            CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
            PYTHONPATH=f"{REPO_ROOT}:{tmp_path / 'code'}",
            CONVEYOR_SHUTDOWN_GRACE_S="600",
            CONVEYOR_FORCED_EXIT_MARGIN_S="600",
        )
        worker = stack.processes[name]
        stack.wait_ready(name)
        log = stack.log_path(name)
        worker.send_signal(signal.SIGTERM)
        until(lambda: "Warm shutdown" in log.read_text(), timeout=30)  # the first one handled
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise AssertionError(f"worker still draining; see {log}") from None
        assert code != 0  # its drain was cut short: the jobs in hand were left pending
        assert "a second SIGTERM: the worker exits now" in log.read_text()
    finally:
        stack.stop()
