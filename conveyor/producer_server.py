"""The producer's server: alone on its port, or sharing it when started with --share-port.
`conveyor up --producers N` (N > 1) starts each so: each binds its own SO_REUSEPORT socket, so
the kernel spreads new connections across the live ones and a process that dies takes only its
own socket away (the others keep answering while `conveyor up` restarts it, with `--share-port`
too), and with it the connections it had accepted or the kernel had queued on it: those are
reset, for their clients to retry. Without the flag a taken port ends the start, as uvicorn's
command line ends it: always shared, a second server started by mistake on a port (another
deployment's, a test's on a port another test process also picked) silently took half its
connections. Each runs with its own CONVEYOR_INSTANCE_ID, hence its own reply channel: a job's
result is published to the process that waits for it. Compose, Kubernetes and the image run it
too, one per container: uvicorn's own command line lacks the head bound below, and its flags
kept settings apart from the CONVEYOR_ variables. Its address is theirs too (CONVEYOR_HOST,
CONVEYOR_PORT; the image sets CONVEYOR_HOST=0.0.0.0): Kubernetes set CONVEYOR_PORT beside a
`--port` flag that alone counted, so a port changed there changed nothing. `--host`/`--port`
override them (`conveyor up`'s)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shared.settings import Settings, settings_or_exit
from shared.telemetry import configure_logging

APP = "producer_api.app:app"
# The most bytes a request's line and headers may take (nginx takes 32 KiB by default): a bearer
# key, a session cookie and trace headers are far shorter.
HEAD_MAX_BYTES = 64 * 1024
log = logging.getLogger(__name__)


def _refusal(status: bytes, text: bytes) -> bytes:
    """A whole HTTP answer of `status` with `text`, written before any request was parsed."""
    fields = b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    return b"HTTP/1.1 %s\r\n%scontent-length: %d\r\n\r\n%s" % (status, fields, len(text), text)


HEAD_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large", b"request line and headers over 64 KiB\n"
)
HEAD_TOO_SLOW = _refusal(b"408 Request Timeout", b"request line and headers not sent in time\n")


def family_of(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal (`::`, `::1`), else IPv4 (an address or a name)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def server_socket(host: str, port: int, share: bool) -> socket.socket:
    """A socket listening on `host:port`. With `share`, other processes of this user asking to
    share may listen there as well (SO_REUSEPORT), else it fails on a port another socket
    listens on. Listening here, not in uvicorn: two started at once may both bind (SO_REUSEADDR)
    and only the second `listen` fails. SO_REUSEADDR as uvicorn binds: a producer restarted
    after its death rebinds while its old connections linger in TIME_WAIT."""
    sock = socket.socket(family_of(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if share:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return sock


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request's head (its line and headers) bounded: a
    head still unfinished once HEAD_MAX_BYTES were read is answered 431 at the next read, and
    the connection closed (asyncio reads 256 KiB at most at a time, so some 320 KiB are parsed
    at most). Unbounded, one client sending a 128 MB header held the event loop (httptools
    gathers a header's value there, slower as it grows): every other request waited up to 9 s
    at a time, for 29 s. A head still unfinished `head_timeout_s` after its first bytes is
    answered 408 and the connection closed: uvicorn waits for one for ever, and a client
    trickling heads (slowloris) held a connection each, as many as it opened."""

    head_timeout_s = 60.0
    _head_bytes = 0
    _in_head = True
    _head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            if self._head_bytes > HEAD_MAX_BYTES:
                self._refuse_head(HEAD_TOO_LARGE)
                return
            if self._head_timer is None:
                timer = self.loop.call_later(self.head_timeout_s, self._refuse_head, HEAD_TOO_SLOW)
                self._head_timer = timer
            self._head_bytes += len(data)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes = True, 0  # a kept-alive connection's next request
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse_head(self, answer: bytes) -> None:
        """`answer`, unless an earlier request's answer is still being written (pipelined):
        then the connection is only closed, the refusal would be written into that answer."""
        self._stop_head_timer()
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(answer)
        self.transport.close()


def bounded_head_protocol(head_timeout_s: float) -> type[BoundedHeadProtocol]:
    """BoundedHeadProtocol with heads timed out after `head_timeout_s` (uvicorn makes the
    protocol itself, from its class)."""
    return type(
        BoundedHeadProtocol.__name__, (BoundedHeadProtocol,), {"head_timeout_s": head_timeout_s}
    )


def server_config(host: str, port: int, settings: Settings) -> uvicorn.Config:
    """The server's config. Requests still running CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S after
    SIGTERM are cut (waits and streams end sooner, within CONVEYOR_STREAM_SHUTDOWN_GRACE_S:
    producer_api/draining.py, stream_shutdown.py). A request's client address and scheme are
    what X-Forwarded-For and X-Forwarded-Proto say only from CONVEYOR_FORWARDED_ALLOW_IPS'
    peers (the console's login throttle counts per client, behind a proxy too). Idle
    connections stay open CONVEYOR_KEEP_ALIVE_S, past a proxy's reuse of them."""
    return uvicorn.Config(
        APP,
        host=host,
        port=port,
        access_log=False,
        server_header=False,  # `server: uvicorn` told scanners what to try (OWASP)
        log_config=None,  # the app's JSON logging (shared/telemetry.py), not uvicorn's text
        timeout_graceful_shutdown=settings.producer_shutdown_grace_s,
        timeout_keep_alive=settings.keep_alive_s,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        http=bounded_head_protocol(settings.request_head_timeout_s),
    )


def listening_socket(host: str, port: int, share: bool = False) -> socket.socket:
    """`server_socket`, or the start ends (uvicorn's exit status for one that failed) on
    one log line naming the address, as uvicorn's command line ends it: a port taken ended this
    server in an OSError's traceback."""
    try:
        return server_socket(host, port, share)
    except (OSError, OverflowError) as exc:  # OverflowError: a --port past 65535
        reason = (getattr(exc, "strerror", None) or str(exc)).lower()
        log.error("error while attempting to bind on address %r: %s", (host, port), reason)
        sys.exit(STARTUP_FAILURE)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="the address to listen on (default: CONVEYOR_HOST)")
    parser.add_argument("--port", type=int, help="the port (default: CONVEYOR_PORT)")
    parser.add_argument(
        "--share-port",
        action="store_true",
        help="share the port with other producers started with this flag (SO_REUSEPORT)",
    )
    args = parser.parse_args(argv)
    settings = settings_or_exit()
    # JSON from the first line on: uvicorn's own logging config wrote its start-up lines as
    # text (the app configures logging only once its lifespan starts)
    configure_logging(settings.log_level)
    host = settings.host if args.host is None else args.host
    port = settings.port if args.port is None else args.port
    sock = listening_socket(host, port, args.share_port)
    config = server_config(host, port, settings)
    # The app before the server: importing it patches uvicorn's exit handler (sse-starlette),
    # which the server installs as it starts; loaded later, SIGTERM never told the app.
    config.load()
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
