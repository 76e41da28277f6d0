"""`make up` works: the same command it runs (`conveyor up`, after `conveyor models prepare`)
starts the real stack with auth on, prints a development key (CONVEYOR_DEV_API_KEY chooses it),
serves a job over HTTP to that key only, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from conveyor.stack import free_port

CONVEYOR = Path(sys.executable).parent / "conveyor"


def test_conveyor_up_serves_embeddings_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_REDIS_URL", "CONVEYOR_AUTH")}
    dev_key = "dev-key-for-make-up-test"
    process = subprocess.Popen(
        [
            str(CONVEYOR),
            "up",
            "--port",
            str(port),
            "--models",
            "identity,minilm",
            "--state-dir",
            str(tmp_path),
        ],
        env={**env, "PYTHONUNBUFFERED": "1", "CONVEYOR_DEV_API_KEY": dev_key},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "Conveyor is up" in line or process.poll() is not None:
                break
        assert any("Conveyor is up" in line for line in lines), "".join(lines)
        assert f"Development API key (tenant dev, all scopes): {dev_key}\n" in lines
        url = f"http://127.0.0.1:{port}/v1/models/minilm/predict"
        body = {"inputs": {"texts": ["a queue in front of a model", "hello world"]}}
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        response = httpx.post(url, json=body, headers={"X-API-Key": dev_key}, timeout=60)
        assert response.status_code == 200, response.text
        assert len(response.json()["outputs"]["embeddings"]) == 2
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
