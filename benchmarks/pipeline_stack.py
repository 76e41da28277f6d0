"""Real pipelines for benchmark configurations: an embedded Valkey, a producer, and workers that
read a temporary copy of the model repository carrying the batching settings under test (the
real `model_repository/` is never edited)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from conveyor.stack import Stack, free_port
from shared.keys import Keys

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
ARTIFACT_DIR = REPO_ROOT / "var" / "models"
BIN = Path(sys.executable).parent
# What parts A, B and D send the identity model: small, like a typical JSON inference request.
IDENTITY_PAYLOAD: dict[str, Any] = {
    "inputs": {"text": "a short sentence of the kind people send to a model", "n": 1}
}


def repository_copy(workdir: Path, name: str, overrides: dict[str, dict[str, Any]]) -> Path:
    """Copy the model repository to `workdir/name`, with `{model: {field: value}}` applied."""
    target = workdir / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(MODEL_REPOSITORY, target)
    for model, fields in overrides.items():
        path = target / model / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config.update(fields)
        if "max_batch_size" in fields:
            _fit_preferred_sizes(config, fields["max_batch_size"])
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def _fit_preferred_sizes(config: dict[str, Any], max_batch_size: int) -> None:
    """A lowered max_batch_size drops the preferred batch sizes above it of the variants that
    batch by it (the config refuses sizes past the maximum)."""
    for variant in (config.get("variants") or {}).values():
        batches_by_it = isinstance(variant, dict) and "max_batch_size" not in variant
        if batches_by_it and "preferred_batch_sizes" in variant:
            fitting = [n for n in variant["preferred_batch_sizes"] if n <= max_batch_size]
            variant["preferred_batch_sizes"] = fitting or [max_batch_size]


@contextmanager
def running_stack(
    workdir: Path, producers: int = 1, valkey_config: dict[str, str] | None = None
) -> Iterator[Stack]:
    """Valkey (with `valkey_config`'s directives) and `producers` producer processes sharing
    one port (reading an unmodified copy of the repository); stopped on exit. API keys are off:
    the baseline has none, and per-key rate limits would cap the load. Valkey writes its
    append-only file, as `conveyor up` runs it: without, its CPU per job left out the writes
    every deployment pays."""
    config = {"appendonly": "yes", **(valkey_config or {})}
    stack = Stack.create(workdir / "logs", valkey_config=config)
    stack.env["CONVEYOR_AUTH"] = "disabled"
    try:
        repository = repository_copy(workdir, "model_repository", {})
        stack.start_producers(
            free_port(), producers, "producer", CONVEYOR_MODEL_REPOSITORY=str(repository)
        )
        yield stack
    finally:
        stack.stop()


def start_worker(
    stack: Stack, workdir: Path, models: str, name: str, overrides: dict[str, dict[str, Any]]
) -> int:
    """A worker for `models` whose configs carry `overrides`; returns its pid once it reads."""
    return stack.wait_ready(spawn_worker(stack, workdir, models, name, overrides))[0]


def spawn_worker(
    stack: Stack, workdir: Path, models: str, name: str, overrides: dict[str, dict[str, Any]]
) -> str:
    """`start_worker` without the wait: returns the name `stack.wait_ready` waits for."""
    repository = repository_copy(workdir, f"repository-{name}", overrides)
    return stack.spawn_worker(
        models,
        name=name,
        CONVEYOR_MODEL_REPOSITORY=str(repository),
        CONVEYOR_ARTIFACT_DIR=str(ARTIFACT_DIR),
    )


def spawn(stack: Stack, name: str, command: list[str], env: dict[str, str]) -> int:
    """Start a process the stack stops with its own, in reverse start order; returns its pid."""
    return stack.spawn(name, command, {"PYTHONPATH": str(REPO_ROOT), **env}).pid


def spawn_api(stack: Stack, name: str, app: str, port: int, env: dict[str, str]) -> int:
    """Start the ASGI `app` ("module:attribute") on `port` with the producer's uvicorn command
    line, as a process of the stack; returns its pid."""
    command = [str(BIN / "uvicorn"), app, "--host", "127.0.0.1", "--port", str(port)]
    return spawn(stack, name, [*command, "--no-access-log"], env)


def database_url(stack: Stack, database: int) -> str:
    """The stack's Valkey, another database: a baseline's keys apart from Conveyor's."""
    return f"{stack.redis_url.rsplit('/', 1)[0]}/{database}"


def wait_until_answers(url: str, body: dict[str, Any], timeout: float = 120.0) -> None:
    """Block until a POST of `body` to `url` answers 200: the server and its backends are up."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.post(url, json=body, timeout=30.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f}s: {last}")


def compact_aof(url: str, timeout: float = 120.0) -> None:
    """Rewrite the server's append-only file now and block until the rewrite is reaped. Systems
    measured on one Valkey grow one AOF: a rewrite the growth of an earlier system's traffic
    set off (auto-aof-rewrite-percentage) then forked, and its child's CPU, reaped into the
    server's, fell inside whichever system's window came next. Rewritten before each window, the
    file starts it compact: a rewrite inside it is one its own writes set off."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        _wait_rewrite_idle(client, deadline)  # one under way refuses another
        client.bgrewriteaof()
        _wait_rewrite_idle(client, deadline)
    finally:
        client.close()


def _wait_rewrite_idle(client: redis.Redis, deadline: float) -> None:
    """Block until no AOF rewrite is under way or scheduled (one waits for a snapshot's end)."""
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]):
            return
        time.sleep(0.05)
    raise TimeoutError("the AOF rewrite did not end in time")


def wait_until_drained(stack: Stack, model: str, variant: str, timeout: float = 60.0) -> None:
    """Block until a partition's stream is empty (workers delete entries as they acknowledge
    them), so one configuration's leftovers never run during the next one's measurement."""
    client = redis.Redis.from_url(stack.redis_url)
    stream = Keys().queue(model, variant)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not client.xlen(stream):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise TimeoutError(f"{stream} still has entries after {timeout:.0f}s")
