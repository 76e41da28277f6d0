"""`conveyor up` on a port below 1024 without the privilege to bind it: the port is the
problem, not CONVEYOR_HOST, which its one line used to blame. (The probe's bind is made to
refuse as the kernel does: these tests may run as root, which may bind any port.)"""

from __future__ import annotations

import errno
import socket

import click
import pytest

from conveyor.commands import up


class _Refused(socket.socket):
    """A socket whose bind fails as a non-root process's on a privileged port."""

    def bind(self, address: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")


def test_a_privileged_port_refused_names_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(up.socket, "socket", _Refused)
    with pytest.raises(click.ClickException) as refused:
        up._refuse_unbindable("127.0.0.1", 80)
    said = refused.value.message
    assert said.startswith("cannot listen on port 80 (Permission denied): "), said
    assert "--port or CONVEYOR_PORT" in said and "CONVEYOR_HOST" not in said, said
