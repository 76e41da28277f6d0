"""A worker whose model fails to load exits non-zero with one line naming the model, its variant
and the cause, and leaves the worker registry as it goes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import REPO_ROOT

ENGINE = """
from workers.engines.base import BatchEngine


class BrokenEngine(BatchEngine):
    def load(self) -> None:
        raise OSError("weights file missing: /nowhere/model.onnx")

    def infer(self, inputs):
        return inputs
"""


def test_a_model_that_fails_to_load_ends_the_worker_with_one_line(
    tmp_path: Path, redis_url: str
) -> None:
    """Celery logged the load's error as two tracebacks (the consumer thread's and its own
    'Unrecoverable error'), neither naming model or variant, and the worker's heartbeat stayed
    in the registry, `warming`, for 10 s after it exited."""
    (tmp_path / "code" / "broken_engine.py").parent.mkdir()
    (tmp_path / "code" / "broken_engine.py").write_text(ENGINE)
    (tmp_path / "repository" / "broken").mkdir(parents=True)
    (tmp_path / "repository" / "broken" / "config.yaml").write_text(
        "kind: batch\nbackend: broken_engine:BrokenEngine\ninput_schema: {type: object}\n"
    )
    stack = Stack.create(tmp_path, redis_url)
    try:
        name = stack.spawn_worker(
            "broken",
            CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
            PYTHONPATH=f"{REPO_ROOT}:{tmp_path / 'code'}",
        )
        worker = stack.processes[name]
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running; see {tmp_path}/{name}.log") from None
        log = stack.log_path(name).read_text()
        assert code != 0, log
        said = "model 'broken', variant 'default' failed to load: OSError: weights file missing"
        assert said in log, log
        assert "Traceback" not in log
        keys, client = Keys(), redis.Redis.from_url(redis_url)
        consumer = stack.consumer_name(worker.pid)
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
        try:
            code = stack.processes[name].wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running; see {tmp_path}/{name}.log") from None
        log = stack.log_path(name).read_text()
        assert code != 0, log
        assert "the worker cannot start: unknown model 'minlm'" in log, log
        assert "Traceback" not in log
    finally:
        stack.stop()
