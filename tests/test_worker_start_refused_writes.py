"""A worker started on a Valkey that refuses writes (its maxmemory, noeviction), as a failover's
old master or a full disk does: it ended at its first write (its consumer groups; then its
Celery consumer's pidbox binding and kombu's visibility sweep, which kombu called
unrecoverable), where it should wait for Redis as it does through an outage. Each test on a
Valkey of its own: maxmemory is server-wide."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from conveyor.stack import Stack
from shared.keys import GROUP, Keys
from tests.conftest import until
from tests.test_webhook_retry_refused import _receiving, _send_webhook, _spawn_worker

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    own = Stack.create(tmp_path_factory.mktemp("start-refused"))
    try:
        yield own
    finally:
        own.stop()


def _logged(stack: Stack, name: str, text: str) -> bool:
    return text in stack.log_path(name).read_text(errors="replace")


def test_a_worker_waits_to_create_its_groups_until_redis_takes_writes(stack: Stack) -> None:
    with _receiving(stack, None) as receiver:
        receiver.refuse_writes()
        name = _spawn_worker(stack, receiver)
        refused = "identity:default: its consumer groups: redis unavailable"
        until(lambda: _logged(stack, name, refused) or not stack.running(name), timeout=120)
        assert stack.running(name), stack.log_tail(name)
        receiver.broker.config_set("maxmemory", 0)
        stack.wait_ready(name)


def test_a_worker_whose_celery_consumer_starts_refused_delivers_once_redis_takes_writes(
    stack: Stack,
) -> None:
    """Its groups made before: the worker serves its queues at once, and its Celery consumer
    (webhook deliveries) starts into the refusal."""
    keys = Keys(stack.settings.key_prefix)
    with contextlib.closing(stack.client()) as client:
        for stream in (keys.queue("identity", "default"), keys.bulk_queue("identity", "default")):
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    with _receiving(stack, None) as receiver:
        receiver.refuse_writes()
        name = _spawn_worker(stack, receiver)
        refused = "maxmemory'..\\nTrying to reconnect"  # Celery's "Cannot connect to …", JSON
        ended = "Unrecoverable error"
        until(lambda: _logged(stack, name, refused) or _logged(stack, name, ended), timeout=120)
        time.sleep(1)  # a few of its restarts, each refused
        assert not _logged(stack, name, ended), stack.log_tail(name)
        assert stack.running(name), stack.log_tail(name)
        receiver.broker.config_set("maxmemory", 0)
        stack.wait_ready(name)
        _send_webhook(stack, receiver)
        until(lambda: receiver.posts >= 1, timeout=30)
