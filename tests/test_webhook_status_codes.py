"""Which answers a webhook delivery retries, on a real local receiver and a real Valkey: a 4xx
that refuses the request itself (a wrong URL, a signature the receiver does not verify) fails at
once, as Amazon SNS fails it, where it was retried for the whole retry window; a 408, 425 or 429
and a 5xx are retried. And a delivery retried for days (Stripe's three) keeps its backoff."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from celery.exceptions import Retry

from shared.settings import Settings
from shared.telemetry import configure_logging
from tests.webhook_receiver import Receiver, attempt, delivering_to, serving
from workers import webhook_delivery
from workers.webhook_delivery import BACKOFF_CAP_S, after_attempt

EVENT = {"id": "evt_status", "type": "job.succeeded"}
REFUSED = (400, 401, 403, 404, 405, 410, 413, 422)
RETRIED = (408, 425, 429, 500, 502, 503, 504)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    script = {f"/hooks/{status}": [status] for status in REFUSED + RETRIED}
    script["/hooks/days"] = [500]
    with serving(script) as server:
        yield server


@pytest.mark.parametrize("status", REFUSED + RETRIED)
def test_a_4xx_that_refuses_the_request_fails_at_once_and_the_others_retry(
    status: int,
    receiver: Receiver,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = delivering_to(receiver.base, "codes:", redis_client, settings_env, monkeypatch)
    job_id = f"j{status}"
    redis_client.hset(keys.job(job_id), "status", "succeeded")
    url = f"{receiver.base}/hooks/{status}"
    run = webhook_delivery.deliver_webhook.run
    if status in REFUSED:
        assert run("job", job_id, url, EVENT, time.time()) == "failed"
    else:
        with pytest.raises(Retry):
            run("job", job_id, url, EVENT, time.time())
    assert [d["status"] for d in receiver.at(f"/hooks/{status}")] == [status]
    recorded = redis_client.hmget(keys.job(job_id), "webhook_status", "webhook_attempts")
    assert recorded[0] == (b"failed" if status in REFUSED else b"retrying")
    (tried,) = json.loads(recorded[1] or b"")
    assert tried["status_code"] == status and tried["error"] == f"HTTP {status}"


def test_a_delivery_retried_for_days_keeps_its_backoff(
    receiver: Receiver,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2 ** (attempt - 1) past attempt 1024 is no float: with a three-day window (about 1,150
    attempts at the 5-minute cap) attempt 1025 raised OverflowError out of the task, which
    Celery acknowledged: the delivery was dropped, its status `retrying` for good."""
    keys = delivering_to(receiver.base, "days:", redis_client, settings_env, monkeypatch)
    settings_env(CONVEYOR_WEBHOOK_RETRY_FOR_S=str(3 * 86_400))
    redis_client.hset(keys.job("j-days"), "status", "succeeded")
    queued: list[float] = []

    def published(countdown: float, throw: bool = True) -> Retry:
        queued.append(countdown)
        return Retry("queued", None)

    monkeypatch.setattr(webhook_delivery.deliver_webhook, "retry", published)
    with pytest.raises(Retry):
        attempt(EVENT, "task-days", 1100, "j-days", f"{receiver.base}/hooks/days")
    assert len(queued) == 1 and BACKOFF_CAP_S / 2 <= queued[0] <= BACKOFF_CAP_S
    assert [d["status"] for d in receiver.at("/hooks/days")] == [500]
    status, delay = after_attempt(5000, {"error": "HTTP 500"}, time.time(), Settings())
    assert status == "retrying" and delay <= BACKOFF_CAP_S


def test_a_redirect_is_not_followed_to_another_host_and_is_retried(
    receiver: Receiver,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receiver allowed by the allow-list could point the delivery anywhere with a Location:
    followed, the signed event would reach a host the allow-list never named."""
    listener = socket.create_server(("127.0.0.1", 0))
    moved = f"http://127.0.0.1:{listener.getsockname()[1]}"

    def answer() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            location = f"Location: {receiver.base}/hooks/elsewhere\r\n"
            connection.sendall(
                f"HTTP/1.1 307 Moved\r\n{location}Content-Length: 0\r\n\r\n".encode()
            )

    threading.Thread(target=answer, daemon=True).start()
    keys = delivering_to(moved, "moved:", redis_client, settings_env, monkeypatch)
    redis_client.hset(keys.job("j-moved"), "status", "succeeded")
    with pytest.raises(Retry):
        webhook_delivery.deliver_webhook.run("job", "j-moved", f"{moved}/hooks", EVENT, time.time())
    assert receiver.at("/hooks/elsewhere") == []
    (tried,) = json.loads(redis_client.hget(keys.job("j-moved"), "webhook_attempts") or b"")
    assert tried["status_code"] == 307


def test_a_refused_connection_is_retried(
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    closed = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()  # nothing listens there now: the connection is refused
    keys = delivering_to(closed, "refused:", redis_client, settings_env, monkeypatch)
    redis_client.hset(keys.job("j-refused"), "status", "succeeded")
    with pytest.raises(Retry):
        webhook_delivery.deliver_webhook.run("job", "j-refused", f"{closed}/h", EVENT, time.time())
    (tried,) = json.loads(redis_client.hget(keys.job("j-refused"), "webhook_attempts") or b"")
    assert tried["error"].startswith("ConnectError"), tried


def test_the_log_names_a_receiver_by_its_origin_alone(
    receiver: Receiver,
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A webhook URL's path and query often carry its credential (Slack's
    /services/T…/B…/<secret>, a `?token=`): each attempt logged the URL in full at INFO, so
    whoever reads the worker's logs could post to the receiver as Conveyor."""
    keys = delivering_to(receiver.base, "logged:", redis_client, settings_env, monkeypatch)
    redis_client.hset(keys.job("j-logged"), "status", "succeeded")
    url = f"{receiver.base}/services/T0/B0/s3cret?token=s3cret"
    with caplog.at_level("INFO", logger=webhook_delivery.log.name):
        status = webhook_delivery.deliver_webhook.run("job", "j-logged", url, EVENT, time.time())
    assert status == "delivered"
    own = [r.getMessage() for r in caplog.records if r.name == webhook_delivery.log.name]
    assert any(receiver.base in line for line in own), own
    assert not any("s3cret" in line or "/services" in line for line in own), own


def test_the_http_clients_request_lines_stay_out_of_the_log() -> None:
    """httpx logs each request's URL in full at INFO, a webhook's credential with it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("DEBUG")
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger(webhook_delivery.log.name).isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], root.level = handlers, level
