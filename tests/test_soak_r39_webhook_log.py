"""Celery's own lines for a webhook delivery (the worker's "Task … received" and "Task …
succeeded", a retry's too) carried the task's arguments in full at INFO: the receiver's URL,
path and query included (often its credential: Slack's /services/…/<secret>, a `?token=`),
which the worker's own lines name by its origin alone, and the event (a job's view, a batch's
record): a third of a soak's worker logs. A real worker on a Valkey of the test's own
delivers one event, retried once (a 503), and its log is read."""

from __future__ import annotations

import contextlib

import pytest

from conveyor.stack import Stack
from shared.keys import Keys
from shared.webhook_events import WebhookDispatcher, event
from tests.conftest import until
from tests.webhook_receiver import serving

pytestmark = pytest.mark.slow
JOB = "j-logged"
PATH = "/services/T0/B0/s3cret?token=s3cret"  # the receiver scripts a path with its query


def test_celery_logs_neither_the_webhooks_credential_nor_its_event(bare_stack: Stack) -> None:
    with serving({PATH: [503]}) as receiver, contextlib.closing(bare_stack.client()) as client:
        client.hset(Keys(bare_stack.settings.key_prefix).job(JOB), "status", "succeeded")
        name = bare_stack.spawn_worker(
            "identity:default",
            CONVEYOR_WEBHOOK_SECRET="whsec-logged",
            CONVEYOR_WEBHOOK_ALLOWLIST=receiver.base,
            # a 503 is a slow failure past a tenth of the timeout, and its receiver is held six
            # times as long: at 10 s, a 5 s stall of either side held the retry past `until`'s
            # 30 s. Nothing here waits on the timeout.
            CONVEYOR_WEBHOOK_TIMEOUT_S="300",
            CONVEYOR_SHUTDOWN_GRACE_S="1",
        )
        bare_stack.wait_ready(name)
        view = {"id": JOB, "status": "succeeded", "outputs": {"answer": "outputs-of-the-job"}}
        body = event("job.succeeded", "default", view, f"{JOB}_succeeded")
        url = f"{receiver.base}{PATH}"
        WebhookDispatcher(bare_stack.redis_url).send("job", JOB, url, body)
        log = bare_stack.log_path(name)
        until(lambda: log.read_text(errors="replace").count("succeeded in") >= 1)
    assert [d["status"] for d in receiver.at(PATH)] == [503, 200]
    lines = [line for line in log.read_text(errors="replace").splitlines() if "Task" in line]
    assert any(f"evt_{JOB}_succeeded" in line and "received" in line for line in lines), lines
    leaked = [line for line in lines if "s3cret" in line or "'outputs'" in line]
    assert not leaked, leaked
