"""Celery's consumer on a broker that accepts connections but refuses writes (a failover's old
master, now a replica; MISCONF; out of memory) restarts at once, about six times a second: each
restart logged an ERROR, and every fifth a CRITICAL "Frequent restarts detected" with its
traceback, some thirty lines for a four-second failover. As the worker's own loops do
(`workers/partition/redis_backoff.py`), a spell is now two lines: its first, and one when the
broker answers again; the restarts between are DEBUG records."""

from __future__ import annotations

import logging

from celery.worker.consumer.consumer import CONNECTION_ERROR, CONNECTION_RETRY

from workers.partition.redis_backoff import OutageSpell

CONSUMER_LOGGER = "celery.worker.consumer.consumer"
CONNECTION_LOGGER = "celery.worker.consumer.connection"
# Celery's own format strings (celery/worker/consumer/{consumer,connection}.py)
FREQUENT_RESTARTS = "Frequent restarts detected: %r"
CONNECTED = "Connected to %s"


class BrokerOutageLog(logging.Filter):
    """On Celery's consumer and connection loggers: passes a spell's first connection error,
    demotes the rest to DEBUG, and turns the next "Connected to" into a WARNING that says how
    long the broker was away and how many restarts that took."""

    def __init__(self) -> None:
        super().__init__()
        self.spell = OutageSpell()

    @classmethod
    def install(cls) -> None:
        outage_log = cls()
        for name in (CONSUMER_LOGGER, CONNECTION_LOGGER):
            logging.getLogger(name).addFilter(outage_log)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == CONNECTED and record.name == CONNECTION_LOGGER:
            self._recovered(record)
            return True
        if not _connection_error(record) or self.spell.failed():
            return True
        _relevel(record, logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

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


def _relevel(record: logging.LogRecord, level: int) -> None:
    record.levelno = level
    record.levelname = logging.getLevelName(level)
