"""An async chat stream closed early (`aclose`, or a `break` out of an `aclosing` block) closes
its HTTP response then, not whenever asyncio finalizes the generator inside it: the producer
cancels a chat's job only once its connection closes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from conveyor.client import AsyncClient
from tests.local_http import LocalServer, QuietHandler, serving

_CHUNK = (
    b'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", '
    b'"choices": []}\n\n'
)


class _Endless(QuietHandler):
    """A chat completion that streams a chunk every 10 ms, for 2 s at most."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(200):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK))
                self.wfile.flush()
                time.sleep(0.01)
        except OSError:
            pass  # the client closed it: what the test wants


@pytest.fixture
def endless() -> Iterator[LocalServer]:
    with serving(LocalServer(_Endless)) as server:
        yield server


async def test_a_chat_stream_closed_early_closes_its_response(endless: LocalServer) -> None:
    """Before, the inner event generator was left to asyncio's finalizer: the response was
    still open once `aclose` returned."""
    responses: list[httpx.Response] = []

    async def keep(response: httpx.Response) -> None:
        responses.append(response)

    async with AsyncClient(endless.url) as client:
        client.http.event_hooks["response"] = [keep]
        chunks = client.chat_stream("m", [{"role": "user", "content": "hi"}])
        assert (await anext(chunks)).id == "c"
        await chunks.aclose()
        assert [response.is_closed for response in responses] == [True]
