"""A TCP proxy to a real Valkey that loses one reply after the server ran its request: a
connection torn at the worst time, for the tests of what is (and is not) sent again."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class ReplyDropper:
    """Forwards everything until, once, a request holding `marker` (a command name as RESP
    spells it): it waits for the server's answer (`answer`, what the client never got) and
    closes the client's side instead of passing it on."""

    def __init__(self, host: str, port: int, marker: bytes = b"EVALSHA") -> None:
        self.target = (host, port)
        self.marker = marker
        self.dropped = 0
        self.answer = b""
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while data := await reader.read(1 << 16):
                up_writer.write(data)
                await up_writer.drain()
                if self.marker in data and not self.dropped:
                    self.dropped += 1
                    back.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await back
                    self.answer = await up_reader.read(1 << 16)  # the server ran it
                    break
        finally:
            back.cancel()
            writer.close()
            up_writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await source.read(1 << 16):
                sink.write(data)
                await sink.drain()


@contextlib.contextmanager
def served_in_thread(proxy: ReplyDropper) -> Iterator[str]:
    """`proxy` serving from an event loop of its own thread, for a blocking client: its URL.
    On exit it stops, and the connections it still serves end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(proxy.start(), loop).result()
    finally:
        asyncio.run_coroutine_threadsafe(_stopped(proxy), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def _stopped(proxy: ReplyDropper) -> None:
    """The proxy stopped, and the connections it still serves ended."""
    await proxy.stop()
    serving = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in serving:
        task.cancel()
    await asyncio.gather(*serving, return_exceptions=True)
