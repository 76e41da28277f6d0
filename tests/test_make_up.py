"""`make up` works: the same command it runs (`conveyor up`, after `conveyor models prepare`)
starts the real stack with auth on, prints a development key (CONVEYOR_DEV_API_KEY chooses it),
serves a job over HTTP to that key only, and stops cleanly on Ctrl-C. Run again, it reuses its
key (and revokes older development keys) instead of adding one more admin key; the CLI finds
its Redis through the state file; and a taken port is refused with a clear message."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.local_stack import StackState
from conveyor.stack import free_port
from tests.conftest import issue_key
from tests.up_process import CONVEYOR, Up, conveyor_up

DEV_KEY_LINE = "Development API key (tenant dev, all scopes): "
DEV_KEY = "dev-key-for-make-up-test"


def _env(**extra: str) -> dict[str, str]:
    own = ("CONVEYOR_REDIS_URL", "CONVEYOR_AUTH", "CONVEYOR_DEV_API_KEY", "CONVEYOR_STATE_DIR")
    return {**{k: v for k, v in os.environ.items() if k not in own}, **extra}


def _cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it in another shell: no CONVEYOR_REDIS_URL, only the state dir."""
    return subprocess.run(
        [str(CONVEYOR), *args],
        env=_env(CONVEYOR_STATE_DIR=str(state_dir)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _printed_key(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith(DEV_KEY_LINE))[
        len(DEV_KEY_LINE) :
    ].strip()


def test_make_up_reuses_its_dev_key_and_the_cli_finds_its_redis(tmp_path: Path) -> None:
    with conveyor_up(tmp_path, "identity", _env(), options=("--producers", "1")) as up:
        first = _printed_key(up.lines)
        banner = "".join(up.lines)  # only the served model's example: minilm's would be a 404
        assert f"producer {up.url} (1 process), workers for identity (" in banner
        assert f"curl -s {up.url}/v1/jobs -H 'authorization: Bearer {first}'" in banner
        assert '"model": "identity"' in banner and "/v1/models/minilm/predict" not in banner
        # each worker's metrics, where Prometheus finds them
        metrics = next(line for line in up.lines if line.startswith("Worker metrics"))
        (worker_metrics,) = re.findall(r"identity (http://127\.0\.0\.1:\d+/metrics)", metrics)
        state = StackState.read(tmp_path)
        assert state is not None
        assert state.producer_url == up.url
        assert Path(state.dev_key_file).read_text().strip() == first
        exports = next(line for line in up.lines if line.strip().startswith("export "))
        assert f"CONVEYOR_REDIS_URL={state.redis_url}" in exports
        assert f"CONVEYOR_API_KEY=$(cat {state.dev_key_file})" in exports
        # an older development key, as earlier `make up` runs left them
        issue_key(state.redis_url, "dev", "admin", name="development key (conveyor up)")
        listed = _cli(tmp_path, "dlq", "list", "identity")
        assert listed.returncode == 0 and listed.stdout == "", listed.stderr
        # the SDK-backed commands find its producer and its key
        submitted = _cli(tmp_path, "submit", "identity", "--input", '{"a": 1}')
        assert submitted.returncode == 0, submitted.stderr
        assert json.loads(submitted.stdout)["outputs"] == {"a": 1}
        finished = 'conveyor_jobs_finished_total{model="identity",state="succeeded",variant='
        assert finished in httpx.get(worker_metrics).text  # the worker that ran it counted it
    assert StackState.read(tmp_path) is None  # Ctrl-C took it away
    with conveyor_up(tmp_path, "identity", _env()) as up:
        assert _printed_key(up.lines) == first  # the same Valkey data: the same key
        keys = [
            json.loads(line)
            for line in _cli(tmp_path, "keys", "list", "--json").stdout.splitlines()
        ]
        dev = [key for key in keys if key["tenant"] == "dev"]
        assert sorted(key["state"] for key in dev) == ["active", "revoked"]
        response = httpx.get(f"{up.url}/v1/models", headers={"X-API-Key": first}, timeout=30)
        assert response.status_code == 200, response.text


def test_conveyor_up_refuses_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(CONVEYOR), "up", "--port", str(port), "--state-dir", str(tmp_path)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert f"port {port} is in use" in result.stderr, result.stderr
    assert "a state dir of its own (--state-dir" in result.stderr, result.stderr  # its data too
    assert not (tmp_path / "valkey").exists()  # refused before starting anything


@pytest.fixture(scope="module")
def embeddings_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, Path]]:
    """One `conveyor up` serving identity and minilm, auth on with a chosen development key,
    and its state dir, for the tests that need one running (its start, minilm's load included,
    was most of each one's time). `conveyor_up` stops it with Ctrl-C once the module's tests
    are done, asserting that it exits cleanly (status 0) there."""
    state_dir = tmp_path_factory.mktemp("embeddings-up")
    with conveyor_up(state_dir, "identity,minilm", _env(CONVEYOR_DEV_API_KEY=DEV_KEY)) as up:
        yield up, state_dir


def test_conveyor_up_serves_embeddings_and_stops_on_ctrl_c(
    embeddings_up: tuple[Up, Path],
) -> None:
    up, _ = embeddings_up
    assert f"{DEV_KEY_LINE}{DEV_KEY}\n" in up.lines
    console = f"{up.url}/console"
    assert any(line.startswith(f"Operator console: {console} ") for line in up.lines)
    assert httpx.get(console).headers["location"] == "/console/login"
    url = f"{up.url}/v1/models/minilm/predict"
    body = {"inputs": {"texts": ["a queue in front of a model", "hello world"]}}
    assert httpx.post(url, json=body, timeout=60).status_code == 401
    response = httpx.post(url, json=body, headers={"X-API-Key": DEV_KEY}, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()["outputs"]["embeddings"]) == 2


def test_a_second_conveyor_up_on_the_same_state_dir_is_refused(
    embeddings_up: tuple[Up, Path],
) -> None:
    """On another port it started a second Valkey on the first one's data directory, and took
    the first one's `stack.json` and logs."""
    up, state_dir = embeddings_up  # the first one
    env = _env(CONVEYOR_AUTH="disabled")
    command = [str(CONVEYOR), "up", "--models", "identity", "--port", str(free_port())]
    second = subprocess.Popen(
        [*command, "--state-dir", str(state_dir)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = second.communicate(timeout=120)
    finally:
        if second.poll() is None:  # as Ctrl-C: a kill would orphan what it started
            second.send_signal(signal.SIGINT)
            second.wait(timeout=90)
    assert second.returncode == 1
    assert stderr.strip() == (
        f"Error: another `conveyor up` uses the state dir {state_dir}: stop it, or give this "
        "one a state dir of its own with --state-dir or CONVEYOR_STATE_DIR"
    )
    state = StackState.read(state_dir)
    assert state is not None and state.producer_url == up.url
    assert httpx.get(f"{up.url}/readyz", timeout=10).status_code == 200
