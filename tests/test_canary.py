"""Canary rollouts on the real pipeline while traffic flows, with two producers competing for
the traffic lease: a variant whose engine fails 20 % of inputs is rolled back to 0 % with the
numbers in its event (and its webhook), a healthy one climbs every step to 100 % (each decision
made once), an abort puts the canary back to 0 %, and bad starts get a 4xx."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner

from conveyor.cli import main
from conveyor.stack import Stack, free_port
from shared.canary_store import Canary, stamp
from shared.codec import loads
from shared.keys import Keys
from shared.webhook_signing import HEADER, OPERATOR, owner_secret, verify
from tests.conftest import REPO_ROOT, running_stack, until
from tests.webhook_receiver import Receiver, serving

TRAFFIC = REPO_ROOT / "tests" / "fixtures" / "traffic_repository"
pytestmark = pytest.mark.slow
BOUNDS = {"max_error_rate": 0.05, "max_p99_ms": 5000}
KEYS = Keys()
SECRET = "canary-secret"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with serving() as server:
        yield server


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> Iterator[tuple[Stack, str]]:
    """The stack, and the URL of its second producer (see `producers`)."""
    with running_stack(
        tmp_path_factory.mktemp("canary-stack"),
        CONVEYOR_MODEL_REPOSITORY=str(TRAFFIC),
        PYTHONPATH=str(REPO_ROOT),  # the FaultEngine backend lives in tests/
        CONVEYOR_AUTH="disabled",  # rollouts, not keys, are under test (test_routes has scopes)
        CONVEYOR_WEBHOOK_SECRET=SECRET,
        CONVEYOR_WEBHOOK_ALLOWLIST=receiver.base,
    ) as running:
        # the worker loads while the second producer starts, not before it
        running.spawn_worker("ab", name="ab-worker")
        no_shadows = {"weights": {"stable": 100}, "shadows": {}}  # half the load on 2 cores
        assert httpx.put(f"{running.base_url}/v1/models/ab/routes", json=no_shadows).is_success
        producer_b = running.start_producer(free_port(), name="producer-b")
        running.wait_ready("ab-worker")
        yield running, producer_b


@pytest.fixture(scope="module")
def stack(pipeline: tuple[Stack, str]) -> Stack:
    return pipeline[0]


@pytest.fixture(scope="module")
def url(stack: Stack) -> str:
    return stack.base_url


@pytest.fixture(scope="module")
def producers(pipeline: tuple[Stack, str], url: str) -> list[str]:
    """A second producer competes for the traffic lease: one leader decides, never both
    (started with the stack, while its worker loads)."""
    return [url, pipeline[1]]


def _until_gauged(producers: list[str], variant: str, state: str, weight: float) -> None:
    """Until the leader's gauges show the canary's end, while no producer still shows it
    running (the gauges live in whichever producer led)."""
    labels = f'model="ab",state="{{}}",variant="{variant}"'

    def gauged() -> bool:
        scrape = "".join(httpx.get(f"{producer}/metrics").text for producer in producers)
        return (
            f"conveyor_canary_state{{{labels.format('running')}}} 1.0" not in scrape
            and f"conveyor_canary_state{{{labels.format(state)}}} 1.0" in scrape
            and f'conveyor_canary_weight{{model="ab",variant="{variant}"}} {weight:.1f}' in scrape
        )

    until(gauged, timeout=10)


class Load:
    """Distinct jobs for `ab` from background threads (about 100 a second, random users)
    until the block ends, so the canary always has fresh traffic to judge. Paced to the rate,
    from a few threads at once: one alone, waiting on each answer, sent a loaded machine's
    ~30 a second, and each step waited three times as long for its `min_requests`."""

    RATE = 100.0  # jobs a second
    SENDERS = 3  # requests in flight at most

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(self.SENDERS)]
        self.numbers = itertools.count()
        self.lock = threading.Lock()
        self.began = 0.0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while True:
                with self.lock:
                    n = next(self.numbers)
                due = self.began + n / self.RATE  # behind it (a slow answer): at once
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                job = {"model": "ab", "inputs": {"n": n, "salt": uuid.uuid4().hex}}
                client.post("/v1/jobs", json={**job, "routing_key": uuid.uuid4().hex})

    def __enter__(self) -> Load:
        self.began = time.monotonic()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def _start(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/ab/canary", json=body)


def _status(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/v1/models/ab/canary").json()
    return body


def _weights(url: str) -> dict[str, float]:
    weights: dict[str, float] = httpx.get(f"{url}/v1/models/ab/routes").json()["weights"]
    return weights


def _run(url: str, variant: str, **options: Any) -> dict[str, Any]:
    """Start a canary and drive traffic until it ends; its final status."""
    started = _start(url, variant=variant, **options)
    assert started.status_code == 201, started.text
    with Load(url):
        until(lambda: _status(url)["canary"]["state"] != "running", timeout=90)
    return _status(url)


def test_a_failing_canary_rolls_back_with_its_numbers(
    url: str, producers: list[str], receiver: Receiver
) -> None:
    hook = f"{receiver.base}/canary"
    view = _run(
        url,
        "flaky",
        steps=[50, 100],
        interval_s=30,
        min_requests=40,
        **BOUNDS,
        webhook=hook,
    )
    canary, events = view["canary"], view["events"]
    assert canary["state"] == "rolled_back" and canary["weight"] == 0
    assert [e["type"] for e in events] == ["started", "step", "rolled_back"]
    rollback = events[-1]
    assert rollback["weight"] == 0 and "error rate" in rollback["reason"]
    assert rollback["numbers"]["canary"]["requests"] >= 40
    assert rollback["numbers"]["canary"]["error_rate"] > 0.05  # the engine fails 20 % of inputs
    assert (
        rollback["numbers"]["canary"]["errors"] / rollback["numbers"]["canary"]["requests"] > 0.05
    )
    assert rollback["numbers"]["baseline"]["error_rate"] == 0
    assert _weights(url) == {"stable": 100.0, "flaky": 0.0}
    _until_gauged(producers, "flaky", "rolled_back", 0)

    def delivered() -> list[str]:
        types = [loads(d["body"])["type"] for d in receiver.at("/canary")]
        return types if "model.canary.rolled_back" in types else []

    types = until(delivered, timeout=30)
    assert {"model.canary.started", "model.canary.step"} <= set(types)
    delivery = next(d for d in receiver.at("/canary") if b"rolled_back" in d["body"])
    payload = loads(delivery["body"])
    assert payload["data"]["numbers"] == rollback["numbers"]
    # the operator's own event, signed with a key no tenant is given
    assert payload["tenant"] == OPERATOR
    verify(owner_secret(SECRET, OPERATOR), delivery["body"], delivery["headers"][HEADER])


def test_a_healthy_canary_reaches_100_percent(url: str, producers: list[str]) -> None:
    view = _run(
        url,
        "candidate",
        steps=[50, 100],
        interval_s=1,
        min_requests=20,
        **BOUNDS,
    )
    canary, events = view["canary"], view["events"]
    assert canary["state"] == "completed" and canary["weight"] == 100
    assert [(e["type"], e["weight"]) for e in events[-4:]] == [
        ("started", 0),
        ("step", 50),
        ("step", 100),
        ("completed", 100),
    ]
    assert all(e["numbers"]["canary"]["requests"] >= 20 for e in events[-2:])
    assert _weights(url)["candidate"] == 100
    _until_gauged(producers, "candidate", "completed", 100)
    restored = httpx.put(f"{url}/v1/models/ab/routes", json={"weights": {"stable": 100}})
    assert restored.status_code == 200, restored.text


def test_a_canary_survives_its_producer_restarting(
    stack: Stack, url: str, producers: list[str]
) -> None:
    """State lives in Redis: a producer stops after the canary's first step and another starts
    in its place; whichever producer leads next carries the rollout on to 100 %, each decision
    made once."""
    options = {"steps": [20, 100], "interval_s": 1, "min_requests": 10, **BOUNDS}
    assert _start(url, variant="candidate", **options).status_code == 201
    until(lambda: _weights(url).get("candidate") == 20)
    stack.stop_process("producer")
    stack.start_producer(int(url.rsplit(":", 1)[1]), name="producer")
    with Load(url):
        until(lambda: _status(url)["canary"]["state"] != "running", timeout=90)
    view = _status(url)
    assert view["canary"]["state"] == "completed"
    mine = [e for e in view["events"] if e["at"] >= view["canary"]["started_at"]]
    assert [(e["type"], e["weight"]) for e in mine] == [
        ("started", 0),
        ("step", 20),
        ("step", 100),
        ("completed", 100),
    ]
    assert httpx.put(f"{url}/v1/models/ab/routes", json={"weights": {"stable": 100}}).is_success


def test_a_shadowed_request_notifies_only_its_own_webhook(
    stack: Stack, url: str, receiver: Receiver
) -> None:
    """Shadows (issue 13) in this stack because it has a webhook receiver: the shadow copy of a
    request with a webhook runs, but only the client's own job is delivered to its webhook."""
    routes = f"{url}/v1/models/ab/routes"
    shadowing = {"weights": {"stable": 100}, "shadows": {"mirror": 1.0}}
    assert httpx.put(routes, json=shadowing).is_success
    hook = f"{receiver.base}/shadowed"
    body = {"model": "ab", "inputs": {"salt": uuid.uuid4().hex}, "webhook": hook}
    done = httpx.post(f"{url}/v1/jobs", json=body, params={"wait": 30}, timeout=60).json()
    assert done["status"] == "succeeded", done
    client = redis.Redis.from_url(stack.redis_url)
    try:
        compared = until(lambda: client.hgetall(KEYS.shadow_result(done["id"])), timeout=30)
        shadow = client.hgetall(KEYS.job(compared[b"shadow_id"].decode()))
        assert shadow[b"status"] == b"succeeded" and b"webhook" not in shadow
        delivered = until(lambda: receiver.at("/shadowed"))
        assert [loads(d["body"])["data"]["id"] for d in delivered] == [done["id"]]
    finally:
        client.close()
        assert httpx.put(routes, json={"weights": {"stable": 100}, "shadows": {}}).is_success


def test_abort_and_bad_starts(url: str, producers: list[str]) -> None:
    bad: list[tuple[dict[str, Any], int, str]] = [
        ({"variant": "nope"}, 422, 'model ab has no variant "nope"'),
        ({"variant": "mirror"}, 422, "a shadow (`shadow: true` in config.yaml)"),
        ({"variant": "stable"}, 422, "are one"),
        ({"variant": "candidate", "steps": [50, 10]}, 422, "ascending"),
        # steps the controller cannot tell from the last (0 before the first): each took an
        # interval and moved nothing, shown as "5 %" twice or as "5e-07 %"
        ({"variant": "candidate", "steps": [5, 5.0000005, 100]}, 422, "5.0000005 % is within"),
        ({"variant": "candidate", "steps": [5e-7, 100]}, 422, "of the 0 % before it"),
        ({"variant": "candidate", "max_error_rate": -1}, 422, "max_error_rate"),
        ({"variant": "candidate", "webhook": "http://evil.example/x"}, 422, "ALLOWLIST"),
        ({"variant": "candidate", "max_step_s": 0}, 422, "max_step_s"),
        # read as inf, stored as null: every decision of the canary raised, and it never moved
        ({"variant": "candidate", "max_p99_ms": "Infinity"}, 422, "max_p99_ms: Input should be"),
        # swapped: `stable` serves everything, its first step would hand `candidate` 95 %
        ({"variant": "stable", "baseline": "candidate"}, 409, "already serves 100 %"),
    ]
    routes = _weights(url)
    for body, code, words in bad:
        response = _start(url, **body)
        assert response.status_code == code, (body, response.text)
        assert words in response.json()["error"]["message"], response.text
    assert _weights(url) == routes
    assert (_status(url)["canary"] or {}).get("state") != "running"
    env = {"CONVEYOR_URL": url}
    runner = CliRunner()
    args = ["canary", "start", "ab", "candidate", "--steps", "10,100", "--interval", "1h"]
    bounds = ["--max-error-rate", "0.02", "--max-p99-ms", "750", "--min-requests", "300"]
    bounds += ["--max-step", "2h"]
    started = runner.invoke(main, [*args, *bounds], env=env)
    assert started.exit_code == 0, started.output
    until(lambda: _weights(url).get("candidate") == 10)
    running = _status(url)["canary"]
    assert (running["steps"], running["interval_s"], running["max_step_s"]) == (
        [10, 100],
        3600,
        7200,
    )
    assert (running["max_error_rate"], running["max_p99_ms"], running["min_requests"]) == (
        0.02,
        750,
        300,
    )
    assert _start(url, variant="candidate").status_code == 409
    status = runner.invoke(main, ["canary", "status", "ab"], env=env)
    assert "running, 10 %" in status.output, status.output
    board = httpx.get(f"{url}/console/routes")  # auth disabled: the console needs no login
    assert board.status_code == 200, board.text
    assert "running</span> candidate at 10% vs stable" in board.text, board.text
    assert "steps 10, 100 · 3600 s each" in board.text and "p99 ≤ 750 ms" in board.text
    aborted = runner.invoke(main, ["canary", "abort", "ab"], env=env)
    assert aborted.exit_code == 0 and "aborted, 0 %" in aborted.output, aborted.output
    assert _weights(url).get("candidate") == 0 and _weights(url)["stable"] == 100
    _until_gauged(producers, "candidate", "aborted", 0)
    again = runner.invoke(main, ["canary", "abort", "ab"], env=env)
    assert again.exit_code != 0 and "409" in again.output


def test_the_started_event_is_never_earlier_than_its_canary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Clients keep a rollout's events by `at >= started_at`: the two are stamped alike, so the
    `started` event, a moment after the canary, cannot round to before it (it did, 1 run in
    some dozens, when `started_at` kept full precision and events were rounded to the ms)."""
    clock = iter([1_000_123_456_700, 1_000_123_456_900])  # the canary, then its event: 0.2 µs on
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    canary = Canary("m", "b", "a", [50.0], 1.0, 0.1, 100.0, 1)
    assert stamp() >= canary.started_at
