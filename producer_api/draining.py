"""The producer asked to stop (SIGTERM). uvicorn lets every request in flight finish before the
app shuts down, and some wait long: a long-poll (`?wait=`, up to `CONVEYOR_MAX_WAIT_S`), a
submit-and-wait, a non-streamed OpenAI answer (as long as its generation). They held the process
past an orchestrator's kill timeout, and their clients got a reset. Once the producer has been
asked to stop for its grace (`CONVEYOR_STREAM_SHUTDOWN_GRACE_S`, what streams get to say goodbye;
a job that ends within it is answered as ever), a request that waits answers with what it has
(the job as it stands, or 503 with the job's id): the job runs on, any producer answers for it.
uvicorn says it will exit through `Server.handle_exit`, which sse-starlette patches to set
`AppStatus.should_exit` (what ends its streams); a watcher sees that flag and then wakes every
reply waiter at once (`ReplyListener.wake_all`: a long-poll or submit-and-wait pays nothing for
it until then) and sets the future that a non-streamed OpenAI answer races (`first`). Readiness
reads the flag at once (`exiting`): it said ready through the whole drain, and a load balancer
kept sending new requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from sse_starlette.sse import AppStatus

from producer_api.reply_listener import ReplyListener
from producer_api.task_cancel import cancel_and_wait, first_done

T = TypeVar("T")
WATCH_S = 0.2  # how soon a waiting request hears of the exit (a read of one flag)


class Draining:
    def __init__(self, replies: ReplyListener, grace_s: float) -> None:
        self._replies = replies
        self._grace_s = grace_s
        self._stopping: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stopping = asyncio.get_running_loop().create_future()
        self._watcher = asyncio.create_task(self._watch(), name="draining")

    async def stop(self) -> None:
        await cancel_and_wait(self._watcher)

    def asked(self) -> bool:
        """Whether the producer was asked to stop."""
        return self._stopping is not None and self._stopping.done()

    def exiting(self) -> bool:
        """Whether uvicorn was told to exit, the grace before the waits end: readiness goes
        false at once, so a load balancer stops sending before anything is cut short."""
        return AppStatus.should_exit or self.asked()

    def begin(self) -> None:
        """The producer is stopping: every wait ends (the watcher's call)."""
        if self._stopping is not None and not self._stopping.done():
            self._stopping.set_result(None)
        self._replies.wake_all()

    async def _watch(self) -> None:
        while not AppStatus.should_exit:
            await asyncio.sleep(WATCH_S)
        await asyncio.sleep(self._grace_s)
        self.begin()

    async def first(self, work: Awaitable[T], timeout: float | None = None) -> T | None:
        """`work`'s result, or None (with `work` cancelled) if `timeout` passes or the producer
        is asked to stop first."""
        rivals = [] if self._stopping is None else [self._stopping]
        task = await first_done(work, rivals, timeout)
        return None if task.cancelled() else task.result()
