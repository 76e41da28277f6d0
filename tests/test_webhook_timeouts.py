"""One webhook attempt against receivers at their worst, on real local sockets: a receiver
that trickles its answer a byte at a time (httpx's timeout bounds each read, so such a receiver
held the worker's one task loop, every other delivery and the worker's exit behind it for as
long as it liked), a URL the allow-list matched but no HTTP client can send to, and a receiver
that asks for time (Retry-After), which the next attempt waits for."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.utils import formatdate
from typing import Any

import pytest
import redis
from celery.exceptions import Retry
from redis.exceptions import RedisClusterException

from shared.celery_broker import VISIBILITY_TIMEOUT_S, broker_app
from shared.keys import Keys
from shared.settings import Settings
from shared.webhook_events import allowed
from tests.webhook_receiver import attempt, delivering_to
from workers import webhook_delivery
from workers.webhook_delivery import (
    BACKOFF_CAP_S,
    AttemptLog,
    ReceiverHolds,
    _post,
    after_attempt,
    retry_delay_s,
)

EVENT = {"id": "evt_1", "type": "job.succeeded"}


@pytest.fixture
def trickling() -> Iterator[str]:
    """A receiver that answers its status line, then one header byte every 0.2 s for 6 s."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(30):
                time.sleep(0.2)
                try:
                    connection.sendall(b"z")
                except OSError:
                    return  # the client gave up
            connection.sendall(b"\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/slow"
    listener.close()


@pytest.fixture
def one_second(settings_env: Callable[..., None]) -> None:
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1", CONVEYOR_WEBHOOK_SECRET="whsec-test")


def test_an_answer_trickled_a_byte_at_a_time_times_out_as_a_whole(
    trickling: str, one_second: None
) -> None:
    outcome = _post(trickling, b"{}", EVENT)
    assert outcome["status_code"] is None
    assert outcome["error"] == "TimeoutError: no answer within 1s", outcome


def test_a_slow_name_lookup_is_cut_off_at_the_timeout(
    one_second: None, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver's name is looked up (getaddrinfo) on a thread of the loop's executor, which
    the timeout cannot stop: closing the loop waited for that thread, however long the lookup
    took, and the worker's one task loop with it."""
    looked_up = threading.Event()
    lookup = socket.getaddrinfo

    def slow_lookup(host: bytes | str, *args: Any, **kwargs: Any) -> list[Any]:
        if host not in (b"slow-dns.example", "slow-dns.example"):  # anyio passes IDNA bytes
            return lookup(host, *args, **kwargs)
        time.sleep(3)
        looked_up.set()
        raise socket.gaierror(socket.EAI_NONAME, "not found")

    monkeypatch.setattr(socket, "getaddrinfo", slow_lookup)
    holds = ReceiverHolds(lambda: redis_client, Keys("slow-dns:"))
    monkeypatch.setattr(webhook_delivery, "_receiver_holds", lambda: holds)
    outcome = _post("http://slow-dns.example/hooks", b"{}", EVENT)
    assert not looked_up.is_set()
    assert outcome["error"] == "TimeoutError: no answer within 1s", outcome


def test_a_host_no_idna_encoding_takes_is_not_allowed() -> None:
    """They matched a `*.` rule and were accepted at submit; the delivery then raised out of
    the task (InvalidURL is no HTTPError), with no attempt on record and no retry."""
    rules = ["https://*.acme.io"]
    assert allowed("https://hooks.acme.io/", rules)
    for url in ("https://\u0661.acme.io/", "https://\u200b.acme.io/"):
        assert not allowed(url, rules), url
        assert _post(url, b"{}", EVENT)["error"].startswith("InvalidURL"), url


def _answering(status_line: str, headers: str) -> str:
    """A receiver that answers one POST with `status_line` and `headers`; its URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            head = f"HTTP/1.1 {status_line}\r\n{headers}Content-Length: 0\r\n\r\n"
            connection.sendall(head.encode())

    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/hooks"


@pytest.mark.parametrize(
    ("status_line", "retry_after", "asked"),
    [
        ("429 Too Many Requests", "120", 120.0),
        ("503 Service Unavailable", "an HTTP date 90 s ahead", 90.0),
        ("503 Service Unavailable", "soon", None),  # unreadable: the backoff alone
        ("429 Too Many Requests", "\u00b2", None),  # a digit float() cannot read
        ("500 Internal Server Error", "120", None),  # means nothing on a 500
        # a year past C's int: parsedate_to_datetime's OverflowError escaped the task, which
        # Celery acknowledged, and the delivery was dropped with no attempt on record
        ("429 Too Many Requests", "Mon, 01 Jan 99999999999 00:00:00 GMT", None),
    ],
)
def test_a_receiver_asking_for_time_gets_it_before_the_next_attempt(
    one_second: None, status_line: str, retry_after: str, asked: float | None
) -> None:
    """Retries kept to their own backoff (1 s, 2 s, ...) whatever a rate-limited receiver
    asked: each came back too soon, and was refused again."""
    if retry_after == "an HTTP date 90 s ahead":
        retry_after = formatdate(time.time() + 90, usegmt=True)
    url = _answering(status_line, f"Retry-After: {retry_after}\r\n")
    outcome = _post(url, b"{}", EVENT)
    assert outcome["error"] == f"HTTP {status_line.split()[0]}"
    if asked is None:
        assert "retry_after_s" not in outcome
        assert retry_delay_s(1, outcome.get("retry_after_s")) <= 1.0  # the first backoff step
        return
    assert asked - 3 <= outcome["retry_after_s"] <= asked  # a date counts whole seconds
    assert asked - 3 <= retry_delay_s(1, outcome["retry_after_s"]) <= asked
    assert retry_delay_s(1, 10 * BACKOFF_CAP_S) == BACKOFF_CAP_S  # never past the cap


def test_the_wait_a_receiver_asked_for_decides_the_next_attempt() -> None:
    """The task retries after the longer of its backoff and the receiver's Retry-After, and
    gives up at once when that wait would end past the retry window."""
    settings = Settings(webhook_retry_for_s=600)
    asked = {"error": "HTTP 429", "retry_after_s": 120.0}
    assert after_attempt(1, asked, time.time(), settings) == ("retrying", 120.0)
    status, delay = after_attempt(1, {"error": "HTTP 500"}, time.time(), settings)
    assert status == "retrying" and 0.5 <= delay <= 1.0
    late = time.time() - 500  # 100 s of the window left: 120 s would pass it
    assert after_attempt(1, asked, late, settings)[0] == "failed"
    assert after_attempt(3, {"error": None}, late, settings) == ("delivered", 0.0)


@pytest.fixture
def hanging() -> Iterator[tuple[str, list[socket.socket]]]:
    """A receiver that takes every connection and never answers; its URL and the connections
    it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def take() -> None:
        while True:
            try:
                taken.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=take, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", taken
    listener.close()
    for connection in taken:
        connection.close()


def test_a_receiver_that_ran_out_the_timeout_is_held_for_its_other_deliveries(
    hanging: tuple[str, list[socket.socket]],
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each delivery to a receiver that hangs ran out the whole timeout on the worker's one
    task loop, every other tenant's delivery queued behind them: now the receiver's other
    deliveries wait out a hold, recorded as attempts not tried, and other receivers are not
    held."""
    origin, taken = hanging
    settings_env(
        CONVEYOR_WEBHOOK_TIMEOUT_S="1",
        CONVEYOR_WEBHOOK_SECRET="whsec-test",
        CONVEYOR_WEBHOOK_ALLOWLIST=origin,
        CONVEYOR_KEY_PREFIX="hold-test:",
    )
    keys = Keys("hold-test:")
    holds = ReceiverHolds(lambda: redis_client, keys)
    monkeypatch.setattr(webhook_delivery, "_receiver_holds", lambda: holds)
    monkeypatch.setattr(webhook_delivery, "_attempt_log", lambda: AttemptLog(redis_client))
    for job_id in ("j1", "j2"):
        redis_client.hset(keys.job(job_id), "status", "succeeded")
        with pytest.raises(Retry):
            webhook_delivery.deliver_webhook.run(
                "job", job_id, f"{origin}/{job_id}", EVENT, time.time()
            )
    assert len(taken) == 1  # j2's delivery did not try the receiver: it was held
    (ran_out,) = json.loads(redis_client.hget(keys.job("j1"), "webhook_attempts") or "")
    (held,) = json.loads(redis_client.hget(keys.job("j2"), "webhook_attempts") or "")
    assert ran_out["error"] == "TimeoutError: no answer within 1s", ran_out
    assert held["error"].startswith("held:") and held["retry_after_s"] > 1, held  # 6 s, less
    assert holds.left_s("http://127.0.0.1:9/other") == 0


@contextmanager
def failing_receiver(
    delay_s: float, on_take: Callable[[], None] = lambda: None
) -> Iterator[tuple[str, list[bytes]]]:
    """A receiver that answers every POST with a 500, `delay_s` after taking it (and calling
    `on_take`); its URL and the requests it took (each counted before its answer)."""
    listener = socket.create_server(("127.0.0.1", 0))
    taken: list[bytes] = []

    def answer(connection: socket.socket) -> None:
        with connection:
            taken.append(connection.recv(65536))
            on_take()
            time.sleep(delay_s)
            connection.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")

    def take() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=take, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", taken
    listener.close()


@pytest.fixture
def failing_slowly() -> Iterator[tuple[str, list[bytes]]]:
    with failing_receiver(0.7) as receiver:
        yield receiver


def test_a_receiver_that_fails_slowly_is_held_as_long_as_it_took_six_times_over(
    failing_slowly: tuple[str, list[bytes]],
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a receiver that ran out the whole timeout was held: one that failed just before it
    (a 500 after 9.9 s of a 10 s timeout) was never held, each of its deliveries retried some
    25 times in an hour at that cost, and 16 of them took a worker's whole delivery time, every
    other tenant's behind them."""
    origin, taken = failing_slowly
    keys = delivering_to(origin, "slow-hold:", redis_client, settings_env, monkeypatch)
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1")
    for job_id in ("j1", "j2"):
        redis_client.hset(keys.job(job_id), "status", "succeeded")
        with pytest.raises(Retry):
            webhook_delivery.deliver_webhook.run(
                "job", job_id, f"{origin}/{job_id}", EVENT, time.time()
            )
    assert len(taken) == 1  # j2's delivery did not try the receiver: it was held
    (failed,) = json.loads(redis_client.hget(keys.job("j1"), "webhook_attempts") or "")
    (held,) = json.loads(redis_client.hget(keys.job("j2"), "webhook_attempts") or "")
    assert failed["error"] == "HTTP 500" and failed["duration_ms"] >= 700, failed
    assert held["error"].startswith("held:"), held
    assert held["retry_after_s"] <= 6 * failed["duration_ms"] / 1000, held


def test_a_cluster_out_of_reach_stops_no_delivery(
    settings_env: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster client is made by reaching a node, and raises RedisClusterException (no
    RedisError) when none answers: the hold looked up before the POST let it escape the task,
    and Celery dropped the delivery for good (seen after a failover of the broker's master).
    The attempt's claim fails too, and the attempt is sent unclaimed."""
    receiver = _answering("200 OK", "")
    settings_env(CONVEYOR_WEBHOOK_SECRET="whsec-test", CONVEYOR_WEBHOOK_ALLOWLIST=receiver)

    def unreachable() -> redis.Redis:
        raise RedisClusterException("Redis Cluster cannot be connected")

    holds = ReceiverHolds(unreachable, Keys("hold-test:"))
    monkeypatch.setattr(webhook_delivery, "_receiver_holds", lambda: holds)
    monkeypatch.setattr(webhook_delivery, "_attempt_log", unreachable)
    monkeypatch.setattr(webhook_delivery, "_redis", unreachable)
    assert attempt(EVENT, "task-j3", 0, "j3", f"{receiver}/j3") == "delivered"


def test_a_dead_workers_pending_retry_is_handed_on_well_within_the_retry_window() -> None:
    """kombu gives an unacknowledged delivery to another worker after its visibility timeout,
    an hour by default: a retry whose worker died waited that long, then found itself out of
    CONVEYOR_WEBHOOK_RETRY_FOR_S after one more attempt. A live worker holds a retry for at
    most BACKOFF_CAP_S before its attempt, which must end before it is handed on (twice)."""
    settings = Settings()
    options = broker_app("redis://127.0.0.1:1/0").conf.broker_transport_options
    visibility = options["visibility_timeout"]
    assert BACKOFF_CAP_S + settings.webhook_timeout_s < visibility
    assert visibility <= settings.webhook_retry_for_s / 4


@pytest.fixture
def failing() -> Iterator[tuple[str, list[bytes]]]:
    with failing_receiver(0.0) as receiver:
        yield receiver


def test_a_restored_copy_of_an_attempt_neither_posts_nor_retries_again(
    failing: tuple[str, list[bytes]],
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kombu hands a delivery left unacknowledged past its visibility timeout to another worker,
    even while its own worker still holds it (a retry's countdown, then its turn): both copies
    posted the same attempt, and, both failing, ran two retry chains. The copy that comes second
    finds the attempt claimed and does nothing; the next attempt (one more retry) posts."""
    origin, taken = failing
    keys = delivering_to(origin, "claim-test:", redis_client, settings_env, monkeypatch)
    redis_client.hset(keys.job("j4"), "status", "succeeded")
    url = f"{origin}/j4"
    queued: list[float] = []

    def published(countdown: float, throw: bool = True) -> Retry:
        """Celery's retry as a worker's: it queues the next attempt, then raises (throw=False:
        returns) Retry. Run directly, a task's retry raises before it queues anything."""
        queued.append(countdown)
        return Retry("queued", None)

    monkeypatch.setattr(webhook_delivery.deliver_webhook, "retry", published)
    with pytest.raises(Retry):
        attempt(EVENT, "task-j4", 0, "j4", url)
    assert attempt(EVENT, "task-j4", 0, "j4", url) == "duplicate"  # no POST, no attempt, no retry
    assert len(taken) == 1
    assert redis_client.ttl(keys.webhook_claim("task-j4", 0)) > Settings().webhook_retry_for_s
    with pytest.raises(Retry):
        attempt(EVENT, "task-j4", 1, "j4", url)
    assert len(taken) == 2
    attempts = json.loads(redis_client.hget(keys.job("j4"), "webhook_attempts") or "")
    assert [attempt["attempt"] for attempt in attempts] == [1, 2]
    # a copy whose worker died in its attempt (claimed, never recorded): the claim lapses soon,
    # and the copy kombu restores later runs the attempt, not "duplicate" for ever
    assert webhook_delivery._claimed_before("task-j4", 2) is False
    running_ttl = redis_client.ttl(keys.webhook_claim("task-j4", 2))
    assert 0 < running_ttl <= Settings().webhook_timeout_s + 60 < VISIBILITY_TIMEOUT_S
    redis_client.delete(keys.webhook_claim("task-j4", 2))  # lapsed
    with pytest.raises(Retry):
        attempt(EVENT, "task-j4", 2, "j4", url)
    assert len(taken) == 3 and len(queued) == 3


class Died(BaseException):
    """The worker's death, as the next attempt is being queued."""


def test_an_attempt_whose_worker_died_before_its_retry_was_queued_runs_again(
    failing: tuple[str, list[bytes]],
    redis_client: redis.Redis,
    settings_env: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim was kept as soon as the attempt was recorded: a worker that died before its
    retry was queued left attempt N claimed for the whole retry window, and the copy kombu
    restored returned "duplicate": no attempt N+1, the delivery stopped for good."""
    origin, taken = failing
    keys = delivering_to(origin, "claim-died:", redis_client, settings_env, monkeypatch)

    def dies(countdown: float, throw: bool = True) -> Retry:
        raise Died

    monkeypatch.setattr(webhook_delivery.deliver_webhook, "retry", dies)
    redis_client.hset(keys.job("j5"), "status", "succeeded")
    url = f"{origin}/j5"
    with pytest.raises(Died):
        attempt(EVENT, "task-j5", 0, "j5", url)
    claim = redis_client.ttl(keys.webhook_claim("task-j5", 0))
    assert 0 < claim <= Settings().webhook_timeout_s + 60  # left to lapse
    redis_client.delete(keys.webhook_claim("task-j5", 0))  # lapsed
    with pytest.raises(Died):  # the restored copy posts the attempt again
        attempt(EVENT, "task-j5", 0, "j5", url)
    assert len(taken) == 2
