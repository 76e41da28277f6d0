"""A plain `pip install .` (no extras) gives a CLI, a producer and a worker that start: every
import outside the engines is a base dependency. The venv's dependencies are cached under
`var/cache/base-venv-<hash of pyproject.toml>` (pip's wheel cache makes the first build quick);
the project itself is reinstalled on every run, so the test sees today's code."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conveyor.stack import free_port
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

DEV_KEY = "dev-key-for-base-install-test"


def _pip(venv: Path, *args: str) -> None:
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
        cwd=REPO_ROOT,
        check=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def base_venv() -> Iterator[Path]:
    digest = hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    venv = REPO_ROOT / "var" / "cache" / f"base-venv-{digest}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs share one build
        if not (venv / ".ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            _pip(venv, ".")
            (venv / ".ready").touch()
        else:
            _pip(venv, "--no-deps", "--force-reinstall", ".")
        yield venv


def _env(venv: Path) -> dict[str, str]:
    """This process's environment minus its own venv and Redis: only the base venv is seen."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CONVEYOR_REDIS_URL", "CONVEYOR_AUTH")
    }
    own_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p != own_bin]
    return {
        **env,
        "PATH": os.pathsep.join([str(venv / "bin"), *path]),
        "PYTHONUNBUFFERED": "1",
        "CONVEYOR_MODEL_REPOSITORY": str(REPO_ROOT / "model_repository"),
        "CONVEYOR_DEV_API_KEY": DEV_KEY,
    }


def test_cli_help_and_imports(base_venv: Path, tmp_path: Path) -> None:
    env = _env(base_venv)
    shown = subprocess.run(
        [str(base_venv / "bin" / "conveyor"), "--help"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "up" in shown.stdout.split("Commands:")[1]
    # from an empty folder, so the installed packages are imported, not the checkout's
    imported = subprocess.run(
        [str(base_venv / "bin" / "python"), "-c", "import producer_api.app, workers.app"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr


def test_conveyor_up_serves_identity(base_venv: Path, tmp_path: Path) -> None:
    port = free_port()
    command = [str(base_venv / "bin" / "conveyor"), "up", "--models", "identity"]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--state-dir", str(tmp_path / "run")],
        env=_env(base_venv),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not any("Conveyor is up" in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)  # exited before it was up
            lines.append(line)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/models/identity/predict",
            json={"inputs": {"hello": "base install"}},
            headers={"authorization": f"Bearer {DEV_KEY}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["outputs"] == {"hello": "base install"}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
