"""The producer's graceful shutdown under `conveyor up` (uvicorn's `timeout_graceful_shutdown`)
is a setting, CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S (25 s by default, once the constant
GRACEFUL_SHUTDOWN_S of conveyor/producer_server.py): a stream grace not below it is refused at
start (its waits were reset rather than answered), the server is given it, and `conveyor up`
kills a stopped producer only past it. A real producer stopped with a request in flight cuts
that request once its grace is over, and exits."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from conveyor.producer_server import server_config
from conveyor.stack import CHILD_MARGIN_S, Stack, free_port
from shared.settings import Settings, bad_setting, settings_or_exit

NAME = "CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S"
STREAM = "CONVEYOR_STREAM_SHUTDOWN_GRACE_S"
CUT = "timeout graceful shutdown exceeded"  # uvicorn's log line as it cuts what still runs


def test_the_default_is_the_constant_it_replaces_and_reaches_uvicorn() -> None:
    settings = Settings()
    assert settings.producer_shutdown_grace_s == 25
    assert server_config("127.0.0.1", 8000, settings).timeout_graceful_shutdown == 25


def test_a_value_set_reaches_uvicorn(settings_env: Callable[..., None]) -> None:
    settings_env(**{NAME: "40"})
    config = server_config("127.0.0.1", 8000, Settings())
    assert config.timeout_graceful_shutdown == 40


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({STREAM: "25"}, STREAM),  # the default graceful shutdown: not below it
        ({NAME: "5", STREAM: "6"}, STREAM),
        ({NAME: "0"}, NAME),
        ({NAME: "1.5"}, NAME),  # whole seconds, as uvicorn's --timeout-graceful-shutdown
    ],
)
def test_a_stream_grace_not_below_it_or_a_bad_value_is_refused_at_start(
    settings_env: Callable[..., None], env: dict[str, str], named: str
) -> None:
    settings_env(**env)
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = bad_setting(refused.value)
    assert f"{named}={env[named]!r}" in line, line
    if named == STREAM:
        assert f"must be below {NAME}" in line, line
    with pytest.raises(SystemExit) as exited:  # the entry module's one line, no traceback
        settings_or_exit()
    assert str(exited.value) == f"Error: {line}"


def test_a_stopped_producer_cuts_what_runs_past_its_grace_and_exits(
    settings_env: Callable[..., None], tmp_path: Path
) -> None:
    """`conveyor up`'s producer given a 2 s grace, and the workers' grace 0: it is killed only
    past its own grace, and cuts a request whose body never comes once that grace is over."""
    grace_s = 2
    settings_env(**{NAME: str(grace_s), STREAM: "0.5", "CONVEYOR_SHUTDOWN_GRACE_S": "0"})
    stack = Stack.create(tmp_path / "stack")
    try:
        port = free_port()
        url = stack.start_producers(port, 1, "r38-grace", CONVEYOR_AUTH="disabled")
        assert stack.stop_timeout_of("producer") >= grace_s + CHILD_MARGIN_S
        with socket.create_connection(("127.0.0.1", port), timeout=30) as held:
            held.sendall(  # headers and a part of the body: the app waits for the rest
                b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            # it reads its connections in turn: one answered after ours was sent read ours first
            assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
            exit_code = stack.stop_process("producer", timeout=CHILD_MARGIN_S + grace_s)
        assert exit_code in (0, -signal.SIGTERM), exit_code
        log = stack.log_path("producer").read_text()
        assert CUT in log, log[-2000:]
    finally:
        stack.stop()
