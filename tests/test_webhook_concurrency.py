"""Webhook deliveries run side by side, CONVEYOR_WEBHOOK_CONCURRENCY of them per worker (Celery's
threads pool, workers/app.py): on the solo pool one receiver answering slowly but in time held
every other tenant's delivery on its worker. Here a real worker (concurrency 2, no `--pool` on
its command line, as compose and Kubernetes start it) delivers to a real receiver that holds
its requests open until the test lets them go: another receiver's event arrives meanwhile,
a third slow one waits in the broker, a stop waits for the deliveries in hand and
acknowledges them, and a worker killed with two in hand leaves both for kombu to restore."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from kombu import Connection

from conveyor.stack import Stack
from shared.celery_broker import kombu_url
from shared.webhook_events import WebhookDispatcher, event
from tests.conftest import until
from tests.webhook_receiver import Receiver, serving

pytestmark = pytest.mark.slow
WORKER = "webhooks"
QUEUE = "celery"  # kombu's queue of the deliveries, and its hash of those taken, unacknowledged
UNACKED = "unacked"


class _HoldingReceiver(ThreadingHTTPServer):
    """Holds every request open until `release` is set, then answers 200. Keeps the target id
    of each arrival."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.open = 0
        self.arrivals: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _HoldingReceiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.arrivals.append(body["data"]["id"])
            self.server.open += 1
        self.server.release.wait()
        with self.server.lock:
            self.server.open -= 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A Valkey of the module's own (its broker queue is read whole) and nothing else yet."""
    own = Stack.create(tmp_path_factory.mktemp("webhook-concurrency"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def broker(stack: Stack) -> Iterator[redis.Redis]:
    with contextlib.closing(stack.client()) as client:
        yield client


@pytest.fixture(scope="module")
def fast() -> Iterator[Receiver]:
    """Another tenant's receiver, which answers at once."""
    with serving() as server:
        yield server


@pytest.fixture
def receiver(stack: Stack, broker: redis.Redis, fast: Receiver) -> Iterator[_HoldingReceiver]:
    """The slow receiver, and a worker allowed to deliver to both (stopped, or killed, by the
    test)."""
    server = _HoldingReceiver()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.start_worker(
        "identity:default",
        name=WORKER,
        CONVEYOR_WEBHOOK_SECRET="whsec-concurrency",
        CONVEYOR_WEBHOOK_ALLOWLIST=f"{server.base}/,{fast.base}/",
        CONVEYOR_WEBHOOK_CONCURRENCY="2",
        # past every wait here: an attempt given up would free its thread (and hold the receiver)
        CONVEYOR_WEBHOOK_TIMEOUT_S="60",
    )
    try:
        yield server
    finally:
        server.release.set()
        if WORKER in stack.processes:  # not stopped by the test
            stack.stop_process(WORKER)
        server.shutdown()
        broker.delete(QUEUE, UNACKED, f"{UNACKED}_index")


def _send(stack: Stack, base: str, target_id: str) -> None:
    body = event("job.succeeded", "default", {"id": target_id}, f"{target_id}_succeeded")
    WebhookDispatcher(stack.redis_url).send("job", target_id, f"{base}/hooks", body)


def _in_broker(client: redis.Redis) -> tuple[list[str], list[str]]:
    """The target ids of the deliveries kombu holds: queued, and taken but not acknowledged."""

    def target(message: dict[str, Any]) -> str:
        _, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        return str(kwargs["target_id"])

    queued = [target(json.loads(message)) for message in client.lrange(QUEUE, 0, -1)]
    # each taken one is kept as [message, exchange, routing key]
    taken = [target(json.loads(entry)[0]) for entry in client.hvals(UNACKED)]
    return sorted(queued), sorted(taken)


def _two_slow_in_hand(stack: Stack, broker: redis.Redis, receiver: _HoldingReceiver) -> None:
    """Three deliveries to the slow receiver: two held open there, the third left queued."""
    for number in range(3):
        _send(stack, receiver.base, f"slow-{number}")
    until(lambda: receiver.open == 2, timeout=15)
    until(lambda: len(_in_broker(broker)[0]) == 1, timeout=15)


def test_a_slow_receiver_does_not_hold_another_receivers_delivery(
    stack: Stack, receiver: _HoldingReceiver, fast: Receiver
) -> None:
    _send(stack, receiver.base, "slow")
    until(lambda: receiver.open == 1, timeout=15)
    _send(stack, fast.base, "fast")
    (delivery,) = until(lambda: fast.at("/hooks"), timeout=15)
    assert json.loads(delivery["body"])["data"]["id"] == "fast"
    # the slow receiver's request is still open (it ends once the test releases it; the worker
    # gives it up only after CONVEYOR_WEBHOOK_TIMEOUT_S, 60 s)
    assert receiver.open == 1 and not receiver.release.is_set()
    receiver.release.set()
    until(lambda: receiver.open == 0, timeout=15)


def test_a_worker_killed_with_deliveries_in_hand_leaves_them_to_kombu(
    stack: Stack, broker: redis.Redis, receiver: _HoldingReceiver
) -> None:
    """As many in hand as the setting allows, each unacknowledged, the third still queued:
    kombu puts both back in the queue once its visibility timeout passed (0 here), for another
    worker (whose attempt finds the dead one's claim lapsed by then)."""
    _two_slow_in_hand(stack, broker, receiver)
    assert stack.stop_process(WORKER, signal.SIGKILL) == -signal.SIGKILL
    assert _in_broker(broker) == (["slow-2"], ["slow-0", "slow-1"])
    assert sorted(receiver.arrivals) == ["slow-0", "slow-1"]
    options = {"visibility_timeout": 0}
    with Connection(kombu_url(stack.redis_url), transport_options=options) as connection:
        connection.default_channel.qos.restore_visible()
    assert _in_broker(broker) == (["slow-0", "slow-1", "slow-2"], [])


def test_a_stop_waits_for_the_deliveries_in_hand_and_acknowledges_them(
    stack: Stack, broker: redis.Redis, receiver: _HoldingReceiver
) -> None:
    """A warm shutdown (SIGTERM) ends the deliveries the threads hold, acknowledged (none left
    for kombu to give another worker, which would find its attempt claimed and drop it); the
    one not taken stays queued."""
    _two_slow_in_hand(stack, broker, receiver)
    log = stack.log_path(WORKER)
    codes: list[int] = []
    stopping = threading.Thread(target=lambda: codes.append(stack.stop_process(WORKER)))
    stopping.start()
    until(lambda: "Warm shutdown" in log.read_text(errors="replace"), timeout=15)
    receiver.release.set()
    stopping.join(timeout=60)
    assert codes == [0], stack.log_tail(WORKER)
    assert _in_broker(broker) == (["slow-2"], [])
    assert sorted(receiver.arrivals) == ["slow-0", "slow-1"]


def test_a_broker_restart_with_a_delivery_in_hand_does_not_end_the_workers_deliveries(
    stack: Stack, broker: redis.Redis, receiver: _HoldingReceiver, fast: Receiver
) -> None:
    """The broker goes away while a thread holds a delivery and the consumer waits in BRPOP:
    kombu's close of that channel failed on the read in flight, a second close found the
    transport detached, and Celery's consumer ended ('Unrecoverable error'): the worker ran on
    with no delivery ever again. It reconnects, and the next event arrives."""
    _send(stack, receiver.base, "held")
    until(lambda: receiver.open == 1, timeout=15)
    stack.restart_valkey(down_s=1.0)
    receiver.release.set()
    _send(stack, fast.base, "after-restart")
    until(lambda: [d for d in fast.at("/hooks") if b"after-restart" in d["body"]], timeout=30)
    assert "Unrecoverable error" not in stack.log_path(WORKER).read_text(errors="replace")
