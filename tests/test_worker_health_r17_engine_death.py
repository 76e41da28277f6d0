"""A worker's `/healthz`, the liveness probe, said only that its consumer thread ran: an engine
that died while the worker was idle (vLLM's engine-core process killed) was seen only when a job
next reached it, so an idle worker with a dead engine answered 200 for ever and was never
restarted. The runtime now asks its generate engines on their own loop, and `/healthz` answers
503 naming the dead engine's partition."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from shared.settings import Settings
from tests.conftest import until
from tests.test_worker_health_r18_engine_death_exit import CoreEngine
from workers.runtime import consumer_runtime
from workers.runtime.consumer_runtime import ConsumerRuntime
from workers.runtime.metrics_server import _handler


@pytest.fixture
def runtime(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ConsumerRuntime]:
    """A started runtime serving `core` on CoreEngine, in this process, that asks it every
    20 ms whether it died."""
    monkeypatch.setattr(consumer_runtime, "ENGINE_CHECK_S", 0.02)
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "config.yaml").write_text(
        f"kind: generate\nbackend: {CoreEngine.__module__}:CoreEngine\n"
    )
    settings = Settings(
        redis_url=redis_url,
        key_prefix="r17-health:",
        model_repository=tmp_path,
        models=["core"],
        gc_freeze=False,
    )
    started = ConsumerRuntime(settings)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def healthz(runtime: ConsumerRuntime) -> Iterator[str]:
    """The worker's `/healthz` over HTTP, for `runtime`."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), _handler(SimpleNamespace(conveyor_runtime=runtime))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_idle_engine_that_died_fails_the_liveness_probe(
    runtime: ConsumerRuntime, healthz: str
) -> None:
    healthy = httpx.get(healthz, timeout=5)
    assert (healthy.status_code, healthy.text) == (200, "ok")
    engine = runtime._engines[0]
    assert isinstance(engine, CoreEngine)
    os.kill(engine.core.pid, signal.SIGKILL)  # no job in hand: no loop calls the engine
    down = until(lambda: (got := httpx.get(healthz, timeout=5)).status_code == 503 and got, 30)
    assert "core:default" in down.text
    assert engine.asked_on == {"conveyor-consumer"}  # never on the probe's thread
