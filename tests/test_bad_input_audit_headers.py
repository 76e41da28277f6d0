"""`conveyor up`'s producer server bounds a request's head (its line and headers) to 64 KiB:
past it the answer is 431 and the connection closes. Unbounded, one client's 128 MB header held
the producer's event loop for 29 s (httptools gathers a header's value there), every other
request waiting seconds at a time. A kept-alive connection's next request gets a fresh bound.
A head unfinished CONVEYOR_REQUEST_HEAD_TIMEOUT_S after its first bytes is answered 408: one
trickled (slowloris) held its connection for ever."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from conveyor.producer_server import HEAD_MAX_BYTES
from conveyor.stack import Stack, free_port

NAME = "producer-head-bound"
HEAD_TIMEOUT_S = 4  # past `_answers`' pauses between a head's pieces


@pytest.fixture(scope="module")
def address(stack: Stack) -> Iterator[tuple[str, int]]:
    port = free_port()
    timeout = str(HEAD_TIMEOUT_S)
    stack.start_producer(
        port, name=NAME, server="conveyor", CONVEYOR_REQUEST_HEAD_TIMEOUT_S=timeout
    )
    try:
        yield "127.0.0.1", port
    finally:
        stack.stop_process(NAME)


def _head(size: int, end: bytes = b"\r\n\r\n") -> bytes:
    """A GET of /healthz whose one extra header makes its head about `size` bytes."""
    return b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * size + end


def _answers(address: tuple[str, int], *pieces: bytes, pause_s: float = 1.0) -> bytes:
    """Everything the server sent on one connection, until it closed it, for `pieces` sent one
    by one, each once the server has read the one before (a server that closes a connection
    with data it has not read resets it, and the reset drops the answer it had written)."""
    with socket.create_connection(address, timeout=30) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(pause_s)  # not timed: it orders the server's reads
        sock.shutdown(socket.SHUT_WR)
        return _until_closed(sock)


def _until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_head_past_the_bound_is_refused_431(address: tuple[str, int]) -> None:
    """The head's first read past the bound is refused: what follows is never parsed."""
    answer = _answers(address, _head(HEAD_MAX_BYTES + 1024, end=b""), b"\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert answer.endswith(b"request line and headers over 64 KiB\n"), answer[-200:]


def test_heads_within_the_bound_are_served_on_one_kept_alive_connection(
    address: tuple[str, int],
) -> None:
    """Each request of the connection counts on its own: three of most of the bound each,
    together past it, are all answered."""
    head = _head(HEAD_MAX_BYTES - 1024)

    answer = _answers(address, head, head, head)

    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3, answer[:300]
    assert b"431" not in answer


def test_a_head_unfinished_past_its_timeout_is_refused_408(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more

        answer = _until_closed(sock)  # before: no answer, the connection held for ever

    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]


def test_an_idle_kept_alive_connection_is_not_timed_as_a_head(address: tuple[str, int]) -> None:
    """The head's clock starts at its first bytes: a connection idle between requests longer
    than the head timeout is the keep-alive's (CONVEYOR_KEEP_ALIVE_S, 75 s) to close."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    answer = _answers(address, request, request, pause_s=HEAD_TIMEOUT_S + 1)

    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2, answer[:300]
    assert b"408" not in answer
