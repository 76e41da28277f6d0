"""Celery's consumer on a broker that accepts connections but refuses writes (a failover's old
master, now a replica; MISCONF; out of memory) restarts at once, about six times a second: each
restart logged an ERROR, and every fifth a CRITICAL "Frequent restarts detected" with its
traceback, some thirty lines for a four-second failover. As the worker's own loops do
(`workers/partition/redis_backoff.py`), a spell is now two lines: its first, and one when the
broker answers again; the restarts between are DEBUG records. kombu's refresh of its binding
tables, refused by a full or unpersisting server whose connection stays up, logged a WARNING
with its traceback every second of the spell: now its first only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery.worker.consumer.consumer import CONNECTION_ERROR, CONNECTION_RETRY

from workers.partition.redis_backoff import OutageSpell

CONSUMER_LOGGER = "celery.worker.consumer.consumer"
CONNECTION_LOGGER = "celery.worker.consumer.connection"
KOMBU_LOGGER = "kombu.transport.redis"
# Celery's and kombu's own format strings (celery/worker/consumer/{consumer,connection}.py,
# kombu/transport/redis.py)
FREQUENT_RESTARTS = "Frequent restarts detected: %r"
CONNECTED = "Connected to %s"
REFRESH_REFUSED = "maybe_refresh_binding_expiry: Redis error, will retry"
# kombu retries a refused binding refresh on every turn of its loop (a second apart): a refusal
# further than this from the last one starts a new spell, the refresh having passed in between.
REFRESH_SPELL_GAP_S = 10.0


class BrokerOutageLog(logging.Filter):
    """On Celery's consumer and connection loggers: passes a spell's first connection error,
    demotes the rest to DEBUG, and turns the next "Connected to" into a WARNING that says how
    long the broker was away and how many restarts that took. On kombu's Redis transport's:
    passes a spell's first refused binding refresh, demotes the rest."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.spell = OutageSpell()
        self.clock = clock
        self._refused_at: float | None = None  # kombu's last refused binding refresh

    @classmethod
    def install(cls) -> None:
        outage_log = cls()
        for name in (CONSUMER_LOGGER, CONNECTION_LOGGER, KOMBU_LOGGER):
            logging.getLogger(name).addFilter(outage_log)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == CONNECTED and record.name == CONNECTION_LOGGER:
            self._recovered(record)
            return True
        if record.msg == REFRESH_REFUSED and record.name == KOMBU_LOGGER:
            return self._refresh_refused(record)
        if not _connection_error(record) or self.spell.failed():
            return True
        return _demoted(record)

    def _refresh_refused(self, record: logging.LogRecord) -> bool:
        """No "Connected to" ends a spell of refused refreshes (the connection stays up): a
        refusal within REFRESH_SPELL_GAP_S of the last one is the same spell's, and DEBUG."""
        now = self.clock()
        repeat = self._refused_at is not None and now - self._refused_at <= REFRESH_SPELL_GAP_S
        self._refused_at = now
        return _demoted(record) if repeat else True

    def _recovered(self, record: logging.LogRecord) -> None:
        if (ended := self.spell.ended()) is None:
            return
        record.msg = f"{CONNECTED} again after %.1fs (%d more connection errors logged at DEBUG)"
        record.args = (*_args(record), *ended)
        _relevel(record, logging.WARNING)


def _connection_error(record: logging.LogRecord) -> bool:
    if record.msg in (CONNECTION_ERROR, FREQUENT_RESTARTS):
        return True
    return record.msg == "%s (%r)" and _args(record)[:1] == (CONNECTION_RETRY,)


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    return record.args if isinstance(record.args, tuple) else ()


def _demoted(record: logging.LogRecord) -> bool:
    """`record` made DEBUG; whether its logger still lets it through at that level."""
    _relevel(record, logging.DEBUG)
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _relevel(record: logging.LogRecord, level: int) -> None:
    record.levelno = level
    record.levelname = logging.getLevelName(level)
