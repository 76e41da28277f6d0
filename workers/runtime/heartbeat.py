"""Celery worker bootstep that publishes this worker's heartbeat (shared/worker_registry.py)
every CONVEYOR_WORKER_HEARTBEAT_S from its own thread, each record living
CONVEYOR_WORKER_HEARTBEAT_TTL_S: state (warming while engines load, serving, draining on
warm shutdown), models, engines, the mean micro-batch size since the last beat and jobs done,
the last two read from this process's Prometheus counters so no loop has to report to it. The
same beat carries what this worker measured its work to cost (cost_meter.py), and every 30 s
it measures this host's clock against Redis's, which the process's job times then read
(shared/redis_clock.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import bootsteps
from celery.worker import state as celery_state
from redis.exceptions import RedisError

from shared.backlog import ServiceCost
from shared.keys import Keys
from shared.metrics import BATCH_SIZE, JOBS_FINISHED
from shared.model_repository import ModelConfigError, ModelRepository
from shared.redis_client import connect
from shared.redis_clock import CLOCK, ClockSkew
from shared.settings import Settings, get_settings
from shared.worker_registry import Heartbeat, WorkerRegistry, WorkerState
from workers.partition.redis_backoff import OutageLog
from workers.runtime.consumer_runtime import consumer_name
from workers.runtime.cost_meter import CostMeter, labelled_total

log = logging.getLogger(__name__)


@dataclass
class Cadence:
    """When the next beat is due: a period after the last one was due, not after it ended, so a
    beat's own time (a slow Redis) does not push every later beat back by as much (beats drifted
    a beat's length further apart each time, the record rewritten past its TTL). One overdue goes
    at once and the beats missed meanwhile are skipped, not sent in a burst. `clock` is
    monotonic seconds."""

    period_s: float
    clock: Callable[[], float] = time.monotonic
    due: float = field(init=False)

    def __post_init__(self) -> None:
        self.due = self.clock()

    def pause_s(self, retry_s: float = math.inf) -> float:
        """How long until the next beat, which is due a period after the last was, or
        `retry_s` from now if sooner (a failed beat's retry), or now if overdue."""
        now = self.clock()
        self.due = max(min(self.due + self.period_s, now + retry_s), now)
        return self.due - now


class _Beater:
    """The heartbeat thread: one asyncio loop and one Redis client for the worker's life;
    `monotonic` the clock its beats are scheduled on."""

    def __init__(
        self, worker: Any, settings: Settings, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.worker = worker
        self.settings = settings
        self.monotonic = monotonic
        repository = ModelRepository.load(settings.model_repository, settings.result_ttl_s)
        partitions = repository.partitions(settings.models)
        self.beat = Heartbeat(
            name=consumer_name(),
            host=socket.gethostname(),
            pid=os.getpid(),
            state="warming",
            models=[f"{config.name}:{variant}" for config, variant in partitions],
            engines=sorted({config.backend_of(variant) for config, variant in partitions}),
            started_at=time.time(),  # the host's until the first measure (`_stamp_start`)
        )
        self._started: float | None = time.monotonic()  # until stamped on Redis's clock
        self.costs = CostMeter(partitions)
        self._stopping = threading.Event()
        self._batches = (0.0, 0.0)
        self._thread = threading.Thread(target=self._run, name="conveyor-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the heartbeat (waits at most 5 s: a daemon thread)."""
        self._stopping.set()
        self._thread.join(timeout=5)

    def _state(self) -> WorkerState:
        if celery_state.should_stop is not None or celery_state.should_terminate is not None:
            return "draining"
        runtime = getattr(self.worker, "conveyor_runtime", None)
        return "serving" if runtime is not None and runtime.alive else "warming"

    def _stamp_start(self, clock: ClockSkew) -> None:
        """`started_at` on Redis's clock, as `last_beat` is (a console's uptime is the two's
        difference), once: when the first measure of the skew ran, dated back by the time
        since the worker started. On the host clock, a skewed worker's uptime was off by the
        skew."""
        if self._started is not None and clock.skew_s is not None:
            self.beat.started_at = CLOCK.now() - (time.monotonic() - self._started)
            self._started = None

    def _refresh(self) -> None:
        total, count = (
            labelled_total(BATCH_SIZE, "_sum", {}),
            labelled_total(BATCH_SIZE, "_count", {}),
        )
        seen_total, seen_count = self._batches
        if count > seen_count:
            self.beat.batch_size = round((total - seen_total) / (count - seen_count), 2)
        else:
            self.beat.batch_size = 0.0
        self._batches = (total, count)
        self.beat.jobs_done = int(labelled_total(JOBS_FINISHED, "_total", {}))
        self.beat.state = self._state()

    def _costs(self) -> dict[tuple[str, str], ServiceCost]:
        """This beat's measured costs; none when measuring failed, so that the beat, which says
        the worker is alive, still goes out."""
        try:
            return self.costs.measure()
        except Exception:
            log.exception("heartbeat: measuring this worker's costs failed; beating without")
            return {}

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # blocks_ms=0: it never blocks, and a worker's block time on top of its timeout held
        # a beat against a frozen Redis that much longer, a long one past the beats' TTL
        retry_s = beat_timeout_s(self.settings)
        client = connect(
            self.settings.redis_url,
            name=f"{self.beat.name}-heartbeat",
            blocks_ms=0,
            timeout_s=retry_s,
        )
        registry = WorkerRegistry(
            client, Keys(self.settings.key_prefix), self.settings.worker_heartbeat_ttl_s
        )
        period = self.settings.worker_heartbeat_s
        outage = OutageLog("heartbeat")  # one line per outage, not one per beat
        clock = ClockSkew(corrects=CLOCK)  # the process's stamps and expiry judgements
        cadence = Cadence(period, self.monotonic)
        try:
            while not self._stopping.is_set():
                retry = math.inf
                try:
                    # measured first (due at start): the first beat's stamp, and the jobs
                    # read meanwhile, were on the raw host clock for up to a beat
                    await clock.check(client)
                    self._stamp_start(clock)
                    self._refresh()
                    await registry.publish(self.beat, self._costs())
                    outage.recovered()
                except RedisError as exc:
                    outage.failed(exc)
                    retry = retry_s  # the record lapses TTL after the last beat
                except Exception:
                    # any other error ended the thread, the worker serving on unseen: its
                    # partitions read as having no consumer (console, scaling, queue ETAs)
                    log.exception("heartbeat: a beat failed; the next is due in %gs", period)
                # on this thread, its loop's only task: an executor thread would be one the
                # interpreter's exit joins, and a worker whose start failed (Celery stops none
                # of its steps) waited up to a beat more to exit
                self._stopping.wait(cadence.pause_s(retry))
            await registry.remove(self.beat.name)
        except RedisError as exc:
            log.warning("heartbeat not removed (%r)", exc)
        finally:
            await client.aclose()


def beat_timeout_s(settings: Settings) -> float:
    """How long a beat waits on Redis: CONVEYOR_REDIS_TIMEOUT_S, at most a third of what the
    TTL leaves past the period. A beat lost on a silent connection (a failover's old host gone
    without a FIN or RST) waited the whole Redis timeout, then a period: the record, rewritten
    `period + timeout + period` after the last beat, lapsed under a shorter TTL, the live worker
    read as gone with Redis up. A failed try and the pause before its retry (each this long at
    most) leave the retry a third of the slack. At the defaults (a 2 s period, a 10 s TTL) it is
    the Redis timeout's 2 s, as before."""
    slack_s = settings.worker_heartbeat_ttl_s - settings.worker_heartbeat_s
    return min(settings.redis_timeout_s, slack_s / 3)


class WorkerHeartbeat(bootsteps.StartStopStep):
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.beater: _Beater | None = None

    def start(self, worker: Any) -> None:
        try:
            self.beater = _Beater(worker, get_settings())
        except ModelConfigError:
            # nothing to beat for: the stream consumer, next to start, refuses the same
            # configuration in one line, where this step's error was Celery's traceback
            return
        self.beater.start()

    def stop(self, worker: Any) -> None:
        if self.beater is not None:
            self.beater.stop()
            self.beater = None
