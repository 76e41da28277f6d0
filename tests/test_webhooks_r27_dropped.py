"""A delivery dropped because the broker refused to queue its next attempt for the whole retry
window kept `webhook_status: retrying` in its job's hash for good, though it will never be sent:
it ends `failed`, as any delivery out of time does. A real worker on a Valkey of the test's own
whose default user may no longer LPUSH (kombu's publish) from the receiver's first answer on,
while the hash's writes (scripts' HSET) still go through."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pytest

from conveyor.stack import Stack
from shared.keys import Keys
from shared.webhook_events import WebhookDispatcher, event
from tests.conftest import until
from tests.test_webhook_retry_refused import _RefusingReceiver, _spawn_worker, _url

pytestmark = pytest.mark.slow
JOB = "j-dropped"


class _PublishRefusingReceiver(_RefusingReceiver):
    """Answers its first POST 503 (Retry-After: 1), having made the broker refuse every publish
    (an ACL denying LPUSH); every later one 200."""

    def refuse_writes(self) -> None:
        self.broker.execute_command("ACL", "SETUSER", "default", "-lpush")


@contextlib.contextmanager
def _receiving(stack: Stack) -> Iterator[_PublishRefusingReceiver]:
    broker = stack.client()
    server = _PublishRefusingReceiver(broker, None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        broker.execute_command("ACL", "SETUSER", "default", "+lpush")
        broker.close()


def test_a_delivery_dropped_for_want_of_a_broker_ends_failed(bare_stack: Stack) -> None:
    bare_stack.env["CONVEYOR_WEBHOOK_RETRY_FOR_S"] = "3"
    with _receiving(bare_stack) as receiver, contextlib.closing(bare_stack.client()) as client:
        job_key = Keys(bare_stack.settings.key_prefix).job(JOB)
        client.hset(job_key, "status", "succeeded")
        bare_stack.wait_ready(_spawn_worker(bare_stack, receiver))
        body = event("job.succeeded", "default", {"id": JOB}, f"{JOB}_succeeded")
        WebhookDispatcher(bare_stack.redis_url).send("job", JOB, _url(receiver), body)
        log = bare_stack.log_path("identity-default")
        until(lambda: "dropped: no next attempt queued" in log.read_text(errors="replace"))
        assert receiver.posts == 1
        status, attempts = client.hmget(job_key, "webhook_status", "webhook_attempts")
    assert status == b"failed", bare_stack.log_tail("identity-default")
    first, dropped = json.loads(attempts or b"[]")
    assert first["status_code"] == 503 and dropped["attempt"] == 2, attempts
    assert dropped["error"].startswith("not queued"), dropped
