"""One of several producer processes serving one port (`conveyor up --producers N`): each binds
its own SO_REUSEPORT socket, so the kernel spreads new connections across the live ones and a
process that dies takes only its own socket away (the others keep answering while
`conveyor up` restarts it), and with it the connections it had accepted or the kernel had
queued on it: those are reset, for their clients to retry. Each runs with its own
CONVEYOR_INSTANCE_ID, hence its own reply channel: a job's result is published to the
process that waits for it."""

from __future__ import annotations

import argparse
import socket

import uvicorn

from shared.settings import Settings, settings_or_exit
from shared.telemetry import configure_logging

APP = "producer_api.app:app"


def family_of(host: str) -> socket.AddressFamily:
    """IPv6 for an IPv6 literal (`::`, `::1`), else IPv4 (an address or a name)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` that other processes of this user may bind as well."""
    sock = socket.socket(family_of(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def server_config(host: str, port: int, settings: Settings) -> uvicorn.Config:
    """The server's config. Requests still running CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S after
    SIGTERM are cut (waits and streams end sooner, within CONVEYOR_STREAM_SHUTDOWN_GRACE_S:
    producer_api/draining.py, stream_shutdown.py). A request's client address and scheme are
    what X-Forwarded-For and X-Forwarded-Proto say only from CONVEYOR_FORWARDED_ALLOW_IPS'
    peers (the console's login throttle counts per client, behind a proxy too)."""
    return uvicorn.Config(
        APP,
        host=host,
        port=port,
        access_log=False,
        server_header=False,  # `server: uvicorn` told scanners what to try (OWASP)
        log_config=None,  # the app's JSON logging (shared/telemetry.py), not uvicorn's text
        timeout_graceful_shutdown=settings.producer_shutdown_grace_s,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = settings_or_exit()
    # JSON from the first line on: uvicorn's own logging config wrote its start-up lines as
    # text (the app configures logging only once its lifespan starts)
    configure_logging(settings.log_level)
    config = server_config(args.host, args.port, settings)
    # The app before the server: importing it patches uvicorn's exit handler (sse-starlette),
    # which the server installs as it starts; loaded later, SIGTERM never told the app.
    config.load()
    uvicorn.Server(config).run(sockets=[reuse_port_socket(args.host, args.port)])


if __name__ == "__main__":
    main()
