"""A worker's start and stop, on workers serving engines written for each test: one whose model
fails to load exits non-zero with one line naming the model, its variant and the cause, and
leaves the worker registry as it goes; a second SIGTERM stops a draining worker at once, as a
second Ctrl-C stops a Celery worker."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import REPO_ROOT, until

BROKEN = """
from workers.engines.base import BatchEngine


class Engine(BatchEngine):
    def load(self) -> None:
        raise OSError("weights file missing: /nowhere/model.onnx")

    def infer(self, inputs):
        return inputs
"""
# A drain held up for good: the engine's close outlasts any grace.
STUCK = """
import time

from workers.engines.base import BatchEngine


class Engine(BatchEngine):
    def load(self) -> None:
        pass

    def infer(self, inputs):
        return inputs

    def close(self) -> None:
        time.sleep(600)
"""


def _spawn(stack: Stack, tmp_path: Path, model: str, engine: str, **env: str) -> str:
    """A worker of `model`, served by the engine whose source is `engine`."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{model}_engine.py").write_text(engine)
    (tmp_path / "repository" / model).mkdir(parents=True)
    (tmp_path / "repository" / model / "config.yaml").write_text(
        f"kind: batch\nbackend: {model}_engine:Engine\ninput_schema: {{type: object}}\n"
    )
    return stack.spawn_worker(
        model,
        CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
        PYTHONPATH=f"{REPO_ROOT}:{tmp_path / 'code'}",
        **env,
    )


def _exit_code(stack: Stack, name: str, says: str) -> int:
    """Worker `name`'s exit status, once it exits within 60 s (else fails, saying `says`)."""
    try:
        return stack.processes[name].wait(timeout=60)
    except subprocess.TimeoutExpired:
        stack.processes[name].kill()
        raise AssertionError(f"worker {says}; see {stack.log_path(name)}") from None


def test_a_model_that_fails_to_load_ends_the_worker_with_one_line(
    tmp_path: Path, redis_url: str
) -> None:
    """Celery logged the load's error as two tracebacks (the consumer thread's and its own
    'Unrecoverable error'), neither naming model or variant, and the worker's heartbeat stayed
    in the registry, `warming`, for 10 s after it exited."""
    stack = Stack.create(tmp_path, redis_url)
    try:
        name = _spawn(stack, tmp_path, "broken", BROKEN)
        pid = stack.processes[name].pid
        code = _exit_code(stack, name, "still running")
        log = stack.log_path(name).read_text()
        assert code != 0, log
        said = "model 'broken', variant 'default' failed to load: OSError: weights file missing"
        assert said in log, log
        assert "Traceback" not in log
        keys, client = Keys(), redis.Redis.from_url(redis_url)
        consumer = stack.consumer_name(pid)
        assert not client.exists(keys.worker(consumer))
        assert client.zscore(keys.workers, consumer) is None
        client.close()
    finally:
        stack.stop()


def test_a_model_missing_from_the_repository_ends_the_worker_with_one_line(
    tmp_path: Path, redis_url: str
) -> None:
    """The heartbeat, the first step to read CONVEYOR_MODELS, raised on it, and Celery logged
    'Unrecoverable error' with a traceback."""
    stack = Stack.create(tmp_path, redis_url)
    try:
        name = stack.spawn_worker("identity", CONVEYOR_MODELS="minlm")  # the worker's own, a typo
        code = _exit_code(stack, name, "still running")
        log = stack.log_path(name).read_text()
        assert code != 0, log
        assert "the worker cannot start: unknown model 'minlm'" in log, log
        assert "Traceback" not in log
    finally:
        stack.stop()


def test_a_second_sigterm_ends_a_drain_at_once(tmp_path: Path, redis_url: str) -> None:
    """Celery ignores every SIGTERM after the first: the worker ran out its whole grace (here
    ten minutes) whatever was sent to it after."""
    stack = Stack.create(tmp_path, redis_url)
    try:
        ten_minutes = {"CONVEYOR_SHUTDOWN_GRACE_S": "600", "CONVEYOR_FORCED_EXIT_MARGIN_S": "600"}
        name = _spawn(stack, tmp_path, "stuck", STUCK, **ten_minutes)
        stack.wait_ready(name)
        log = stack.log_path(name)
        stack.processes[name].send_signal(signal.SIGTERM)
        until(lambda: "Warm shutdown" in log.read_text(), timeout=30)  # the first one handled
        stack.processes[name].send_signal(signal.SIGTERM)
        code = _exit_code(stack, name, "still draining")
        assert code != 0  # its drain was cut short: the jobs in hand were left pending
        assert "a second SIGTERM: the worker exits now" in log.read_text()
    finally:
        stack.stop()
