"""Celery's own Redis connections (its broker: webhook deliveries) get the bounds every other
pool has, so a frozen Redis delays a publish by `CONVEYOR_REDIS_TIMEOUT_S` instead of forever.
The socket timeout leaves room for kombu's BRPOP, which blocks `BRPOP_S` on an idle queue."""

from __future__ import annotations

from typing import Any

from celery import Celery

from shared.settings import get_settings

BRPOP_S = 1.0  # kombu's default brpop_timeout


def broker_app(broker_url: str, **options: Any) -> Celery:
    """A Celery app on `broker_url` whose broker sockets time out."""
    timeout = get_settings().redis_timeout_s
    app = Celery("conveyor", broker=broker_url, **options)
    app.conf.broker_transport_options = {
        "socket_timeout": timeout + BRPOP_S,
        "socket_connect_timeout": timeout,
    }
    return app
