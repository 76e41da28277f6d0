"""No answer names the server software: `server: uvicorn` on every response, the console's
included, told a scanner which exploits to try (OWASP's HTTP headers cheat sheet). Under
uvicorn's command line, and under the server `conveyor up`, compose, Kubernetes and the image
run (conveyor/producer_server.py, as the test stack runs it; tests/test_deploy_producer_server.py
pins the deployments' command to it)."""

from __future__ import annotations

import httpx

from conveyor.stack import Stack, free_port

PATHS = ("/healthz", "/console/login", "/v1/models", "/no-such-route")


def _assert_unnamed(base_url: str) -> None:
    for path in PATHS:
        headers = httpx.get(f"{base_url}{path}").headers
        assert "server" not in headers, (path, headers)


def test_uvicorns_command_line_names_no_server(stack: Stack) -> None:
    name = "producer-unnamed"
    base_url = stack.start_producer(free_port(), name=name, server="uvicorn")
    try:
        _assert_unnamed(base_url)
    finally:
        stack.stop_process(name)


def test_conveyor_ups_server_names_no_server(base_url: str) -> None:
    _assert_unnamed(base_url)
