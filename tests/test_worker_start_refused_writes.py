"""A worker started on a Valkey that refuses writes (its maxmemory, noeviction), as a failover's
old master or a full disk does: it ended at its first write (its consumer groups; then its
Celery consumer's pidbox binding and kombu's visibility sweep, which kombu called
unrecoverable), where it should wait for Redis as it does through an outage. Each test on a
Valkey of its own: maxmemory is server-wide."""

from __future__ import annotations

import contextlib
import time

import pytest

from conveyor.stack import Stack
from shared.keys import GROUP, Keys
from tests.conftest import until
from tests.test_webhook_retry_refused import _receiving, _send_webhook, _spawn_worker

pytestmark = pytest.mark.slow


def _logged(stack: Stack, name: str, text: str) -> bool:
    return text in stack.log_path(name).read_text(errors="replace")


def test_a_worker_waits_to_create_its_groups_until_redis_takes_writes(bare_stack: Stack) -> None:
    with _receiving(bare_stack, None) as receiver:
        receiver.refuse_writes()
        name = _spawn_worker(bare_stack, receiver)
        refused = "identity:default: its consumer groups: redis unavailable"
        until(
            lambda: _logged(bare_stack, name, refused) or not bare_stack.running(name), timeout=120
        )
        assert bare_stack.running(name), bare_stack.log_tail(name)
        receiver.broker.config_set("maxmemory", 0)
        bare_stack.wait_ready(name)


def test_a_worker_whose_celery_consumer_starts_refused_delivers_once_redis_takes_writes(
    bare_stack: Stack,
) -> None:
    """Its groups made before: the worker serves its queues at once, and its Celery consumer
    (webhook deliveries) starts into the refusal."""
    keys = Keys(bare_stack.settings.key_prefix)
    with contextlib.closing(bare_stack.client()) as client:
        for stream in (keys.queue("identity", "default"), keys.bulk_queue("identity", "default")):
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    with _receiving(bare_stack, None) as receiver:
        receiver.refuse_writes()
        name = _spawn_worker(bare_stack, receiver)
        refused = "maxmemory'..\\nTrying to reconnect"  # Celery's "Cannot connect to …", JSON
        ended = "Unrecoverable error"
        until(
            lambda: _logged(bare_stack, name, refused) or _logged(bare_stack, name, ended),
            timeout=120,
        )
        time.sleep(1)  # a few of its restarts, each refused
        assert not _logged(bare_stack, name, ended), bare_stack.log_tail(name)
        assert bare_stack.running(name), bare_stack.log_tail(name)
        receiver.broker.config_set("maxmemory", 0)
        bare_stack.wait_ready(name)
        _send_webhook(bare_stack, receiver)
        until(lambda: receiver.posts >= 1, timeout=30)
