"""No answer names the server software: `server: uvicorn` on every response, the console's
included, told a scanner which exploits to try (OWASP's HTTP headers cheat sheet). Under
uvicorn's command line, as the stack, compose, Kubernetes and the image run it, and under
`conveyor up`'s own server (conveyor/producer_server.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from conveyor.stack import Stack, free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
PATHS = ("/healthz", "/console/login", "/v1/models", "/no-such-route")


def _assert_unnamed(base_url: str) -> None:
    for path in PATHS:
        headers = httpx.get(f"{base_url}{path}").headers
        assert "server" not in headers, (path, headers)


def test_uvicorns_command_line_names_no_server(base_url: str) -> None:
    _assert_unnamed(base_url)


def test_conveyor_ups_server_names_no_server(stack: Stack) -> None:
    name = "producer-unnamed"
    base_url = stack.start_producer(free_port(), name=name, server="conveyor")
    try:
        _assert_unnamed(base_url)
    finally:
        stack.stop_process(name)


def _compose() -> list[str]:
    compose = yaml.safe_load((REPO_ROOT / "compose" / "docker-compose.yml").read_text())
    command: list[str] = compose["services"]["producer"]["command"]
    return command


def _kubernetes() -> list[str]:
    documents = yaml.safe_load_all((REPO_ROOT / "k8s" / "base" / "producer.yaml").read_text())
    deployment = next(d for d in documents if d and d["kind"] == "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    command: list[str] = next(c for c in containers if c["name"] == "producer")["command"]
    return command


def _image() -> list[str]:
    lines = (REPO_ROOT / "compose" / "Dockerfile").read_text().splitlines()
    command: list[str] = json.loads(next(line for line in lines if line.startswith("CMD "))[4:])
    return command


@pytest.mark.parametrize("command", [_compose, _kubernetes, _image])
def test_each_deployed_producer_runs_uvicorn_without_its_server_header(
    command: Callable[[], list[str]],
) -> None:
    ran = command()
    assert ran[:2] == ["uvicorn", "producer_api.app:app"], ran
    assert "--no-server-header" in ran, ran
