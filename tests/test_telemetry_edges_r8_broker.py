"""CONVEYOR_REDIS_URL's query, in redis-py's spelling, as Celery's broker reads it: the
database it names, and the connection options only redis-py takes."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from shared.celery_broker import broker_app, kombu_url

DATABASE = 7  # none of the session's other tests write there


@pytest.fixture
def database(redis_url: str) -> Iterator[redis.Redis]:
    """Database DATABASE of the session's server, empty before and after the test."""
    client = redis.Redis.from_url(redis_url, db=DATABASE)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def test_a_database_and_options_in_the_query_reach_the_broker(
    redis_url: str, database: redis.Redis
) -> None:
    """redis-py takes `?db=7` (and its connection options) as the producer's and workers'
    clients do; kombu refused every query key but `ssl_*` with a TypeError, so no webhook was
    ever handed over, and a worker's consumer never connected."""
    query = f"db={DATABASE}&protocol=3&client_name=cv"
    url = urlunsplit(urlsplit(redis_url)._replace(path="/0", query=query))
    broker_app(url).send_task("conveyor.test.nothing", kwargs={})
    assert database.llen("celery") == 1


def test_tls_options_in_the_query_stay_kombus() -> None:
    assert kombu_url("rediss://h:6380/0?db=2&ssl_ca_certs=/ca.pem&socket_timeout=3") == (
        "conveyor-redis://h:6380/2?ssl_ca_certs=%2Fca.pem&ssl_cert_reqs=required"
    )
