"""A plain `pip install .` (no extras) gives a CLI, a producer and a worker that start: every
import outside the engines is a base dependency. The venv is cached under
`var/cache/base-venv-<hash of the base dependencies>` (pip's wheel cache makes its first build
quick); the project itself is reinstalled on every run, so the test sees today's code."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT
from tests.up_process import conveyor_up

pytestmark = pytest.mark.slow

DEV_KEY = "dev-key-for-base-install-test"
CACHE = REPO_ROOT / "var" / "cache"


def _pip(venv: Path, *args: str) -> None:
    """`pip install` into the venv, by this venv's pip (the base venv has none: creating it
    without pip saves its own install), then its bytecode compiled on every core, as the
    Makefile does: pip compiles one file at a time."""
    # setuptools builds in ./build; modules deleted since the last build must not linger there
    shutil.rmtree(REPO_ROOT / "build", ignore_errors=True)
    python = str(venv / "bin" / "python")
    for command in (
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", *args],
        [python, "-m", "compileall", "-q", "-j", "0", str(venv / "lib")],
    ):
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr


def _base_requirements_digest() -> str:
    """What the base venv's contents depend on: the build system, the Python version and the
    base dependencies (not the extras or the tools' settings)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    basis = [project["build-system"], project["project"]["dependencies"], sys.version]
    return hashlib.sha256(json.dumps(basis).encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def base_venv() -> Iterator[Path]:
    venv = CACHE / f"base-venv-{_base_requirements_digest()}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "base-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # test runs share one build
        if not (venv / ".ready").exists():
            for stale in CACHE.glob("base-venv-*"):  # built for other dependencies
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
            subprocess.run(
                [sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], check=True
            )
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
        "CONVEYOR_MODEL_REPOSITORY": str(REPO_ROOT / "model_repository"),
        "CONVEYOR_DEV_API_KEY": DEV_KEY,
    }


def _start(venv: Path, folder: Path, *command: str) -> subprocess.Popen[str]:
    """Start a program of the venv from an empty folder (so the installed packages are
    imported, not the checkout's)."""
    program, *args = command
    return subprocess.Popen(
        [str(venv / "bin" / program), *args],
        env=_env(venv),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _succeeded(process: subprocess.Popen[str]) -> str:
    """The program's output; it must succeed."""
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, stderr
    return stdout


def test_cli_help_and_imports(base_venv: Path, tmp_path: Path) -> None:
    """Each check is a fresh process of its own; they run side by side (one waited on after
    the other, they took most of this test's time)."""
    # the OTLP exporters each protocol loads (shared/telemetry.py), imported when tracing starts
    exporters = [f"opentelemetry.exporter.otlp.proto.{p}.trace_exporter" for p in ("grpc", "http")]
    commands = [
        ("conveyor", "--help"),
        ("python", "-c", "import producer_api.app, workers.app"),
        *(("python", "-c", f"import {module}") for module in exporters),
    ]
    processes = [_start(base_venv, tmp_path, *command) for command in commands]
    try:
        outputs = [_succeeded(process) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert "up" in outputs[0].split("Commands:")[1]


def test_conveyor_up_serves_identity(base_venv: Path, tmp_path: Path) -> None:
    conveyor = base_venv / "bin" / "conveyor"
    with conveyor_up(tmp_path / "run", "identity", _env(base_venv), conveyor, tmp_path) as up:
        response = httpx.post(
            f"{up.url}/v1/models/identity/predict",
            json={"inputs": {"hello": "base install"}},
            headers={"authorization": f"Bearer {DEV_KEY}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert response.json()["outputs"] == {"hello": "base install"}
