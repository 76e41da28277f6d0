"""A micro-batch that runs long: its jobs marked running once it has run RUNNING_MARK_S (so the
job view shows it; a quick one never pays for the mark), then its entries re-claimed every third
of the visibility timeout until its write-back (the first within two thirds of its oldest
entry's read, however long the micro-batch gathered before). A bisection's reruns or a wait for
the device could outlast the timeout: another worker reclaimed the entries, ran the jobs again
and put a false `crashed` attempt on their records. The entries not run (expired, cancelled) are
written back with the results, so they are re-claimed too: untouched, an expired job was
reclaimed, and run as a redelivery (which `max_queue_time` does not bound). Its engine call has a
ceiling, `queue.max_run_s`: one that never returns (a wedged kernel, a deadlocked library) kept
its jobs claimed, and its partition reading nothing, for as long as the worker lived."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from shared.job_store import now_ms
from workers.partition.stream_reader import Delivery, StreamReader

log = logging.getLogger(__name__)
RUNNING_MARK_S = 0.1
TOUCH_RETRY_S = 0.5  # how soon a mark or touch Redis failed is tried again


class LongRun:
    """Watches one micro-batch from its read until `end` (its write-back), off the loop's path;
    a mark or touch Redis fails is tried again soon. Once its engine call has run `max_run_s`
    (0: no ceiling) it stops touching and calls `hung`: the engine is deemed dead."""

    def __init__(
        self,
        reader: StreamReader,
        stream: str,
        entries: Sequence[Delivery],
        runnable: Sequence[Delivery],
        touch_every_s: float,
        max_run_s: float,
        hung: Callable[[], None],
    ) -> None:
        self.reader = reader
        self.stream = stream
        self.entry_ids = [delivery.entry_id for delivery in entries]  # all kept claimed
        # when the oldest was read (its idle time since, as the reclaimer sees it)
        self.read_ms = min((delivery.claimed_ms for delivery in entries), default=now_ms())
        self.runnable = runnable  # marked running
        self.touch_every_s = touch_every_s
        self.max_run_s = max_run_s
        self.hung = hung
        self._task: asyncio.Task[None] | None = None
        self._marked = self._touching = False
        self._ceiling: asyncio.TimerHandle | None = None
        self._timer = asyncio.get_running_loop().call_later(RUNNING_MARK_S, self._start)

    def started(self) -> None:
        """The engine takes the micro-batch up now (a staged engine's pipeline: its wait for
        the device counts); from now on its run is bounded by `max_run_s`."""
        if self.max_run_s:
            self._ceiling = asyncio.get_running_loop().call_later(self.max_run_s, self._overran)

    def end(self) -> None:
        self._timer.cancel()
        if self._ceiling is not None:
            self._ceiling.cancel()
        if self._task is not None:
            self._task.cancel()

    def _overran(self) -> None:
        """Past the ceiling: the entries go back untouched, to be redelivered elsewhere."""
        self.end()
        self.hung()

    def _start(self) -> None:
        self._task = asyncio.create_task(self._watch())
        self._task.add_done_callback(_log_failure)

    async def _watch(self) -> None:
        """Until `end` cancels it (a Redis call that lost the cancel raises it all the same:
        shared/redis_client.py)."""
        while True:
            await asyncio.sleep(await self._tick())

    async def _tick(self) -> float:
        """The mark, then a touch each time; the seconds until the next: `touch_every_s`, or
        TOUCH_RETRY_S after one Redis failed (the outage is the loop's to log: two lines however
        long). Tried again only a period later, a micro-batch running through an outage as long
        as the visibility timeout stayed untouched up to a third of it after Redis was back,
        ample time for another worker's reclaimer to take it over and run it again."""
        touching = self._touching
        try:
            if not self._marked:
                await self.reader.mark_running(self.runnable)
                self._marked = True
            if touching and (lost := await self.reader.touch(self.stream, self.entry_ids)):
                # another worker took them over all the same (this one could not reach Redis):
                # FINISH refuses this one's results, the new owner's stand
                log.warning("%d entries of a micro-batch were taken over", len(lost))
        except RedisError as exc:
            log.debug("a long micro-batch's mark or touch failed: %r", exc)
            return min(self.touch_every_s, TOUCH_RETRY_S)
        finally:
            self._touching = True
        return self.touch_every_s if touching else self._first_touch_in()

    def _first_touch_in(self) -> float:
        """Seconds from the mark to the first touch: a period, or less, so that the oldest entry
        is touched within two periods of its read (a third of the timeout to spare). Its read
        was not the watch's start: a gather held it untouched up to `max_queue_delay_ms` before,
        and a period after the mark left it idle past the timeout once that was over a third."""
        idle_s = (now_ms() - self.read_ms) / 1000.0
        return max(0.0, min(self.touch_every_s, 2 * self.touch_every_s - idle_s))


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("could not mark a micro-batch running or keep it claimed: %s", exc)
