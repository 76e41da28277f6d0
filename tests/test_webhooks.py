"""Webhooks for real: a local HTTP receiver that fails twice before accepting, a Celery worker
that delivers the event signed with its tenant's key, with backoff, and records every attempt,
and the allow-list that refuses other URLs at submit."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from kombu.exceptions import OperationalError

from conveyor.commands.keys import command as keys_command
from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from shared.keys import Keys
from shared.settings import Settings
from shared.webhook_events import allowed
from shared.webhook_signing import (
    HEADER,
    OPERATOR,
    InvalidSignature,
    owner_secret,
    sign,
    verify,
)
from tests.conftest import issue_key, running_stack, until
from tests.webhook_receiver import Receiver, serving
from workers import webhook_delivery

pytestmark = pytest.mark.slow
SECRET = "whsec-test-1234"
# With auth disabled every job and batch is the `default` tenant's, signed with its key.
DEFAULT_KEY = owner_secret(SECRET, "default")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with serving({"/hooks/flaky": [500, 500]}) as server:
        yield server


@pytest.fixture(scope="module")
def hook_stack(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Stack]:
    """Producer and an identity worker (which also runs the Celery webhook task), both allowed
    to call only the receiver's /hooks/ paths."""
    with running_stack(
        tmp_path_factory.mktemp("webhooks"),
        CONVEYOR_AUTH="disabled",
        CONVEYOR_WEBHOOK_SECRET=SECRET,
        CONVEYOR_WEBHOOK_ALLOWLIST=f"{receiver.base}/hooks/",
        workers=("identity:default",),
    ) as stack:
        yield stack


def _lines(count: int) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"w{i}", "body": {"inputs": {"i": i}}}).encode() + b"\n"
        for i in range(count)
    )


def test_batch_webhook_is_signed_and_retried_until_accepted(
    hook_stack: Stack, receiver: Receiver
) -> None:
    url = f"{receiver.base}/hooks/flaky"
    created = httpx.post(
        f"{hook_stack.base_url}/v1/batches",
        params={"model": "identity", "webhook": url},
        content=_lines(3),
        timeout=30,
    )
    assert created.status_code == 202, created.text
    batch_id = created.json()["id"]
    batch_url = f"{hook_stack.base_url}/v1/batches/{batch_id}"

    def delivered() -> dict[str, Any] | None:
        batch: dict[str, Any] = httpx.get(batch_url).json()
        return batch if (batch["webhook"] or {}).get("status") == "delivered" else None

    batch = until(delivered)
    attempts = receiver.at("/hooks/flaky")
    assert [d["status"] for d in attempts] == [500, 500, 200]
    for delivery in attempts:
        verify(DEFAULT_KEY, delivery["body"], delivery["headers"][HEADER])
    events = [json.loads(d["body"]) for d in attempts]
    assert len({e["id"] for e in events}) == 1, "retries must carry the same event id"
    assert events[0]["type"] == "batch.completed"
    assert events[0]["data"]["id"] == batch_id and events[0]["data"]["counts"]["succeeded"] == 3
    gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, f"no exponential backoff between tries: {gaps}"
    recorded = batch["webhook"]["attempts"]
    assert [a["status_code"] for a in recorded] == [500, 500, 200]
    assert [a["attempt"] for a in recorded] == [1, 2, 3]


def test_urls_outside_the_allow_list_are_refused_at_submit(
    hook_stack: Stack, receiver: Receiver
) -> None:
    port = receiver.server_address[1]
    for url in (
        f"{receiver.base}/elsewhere",
        f"{receiver.base}/hooks-evil/x",
        f"{receiver.base}/hooks/../elsewhere",  # dot segments, resolved by the HTTP client
        f"{receiver.base}/hooks/%2e%2e/elsewhere",
        f"{receiver.base}/elsewhere//..//hooks/x",  # checked as /hooks/x, sent elsewhere
        f"https://127.0.0.1:{port}/hooks/x",
        f"http://user:pw@127.0.0.1:{port}/hooks/x",
        f"http://127.0.0.1:{port + 1}/hooks/x",
        "http://169.254.169.254/hooks/",
        "http://[::1/hooks/x",  # an unclosed IPv6 literal: urlsplit raised, a 500
        f"{receiver.base}/hooks/a\x00b",  # accepted, then every delivery raised in httpx
        f"{receiver.base}/hooks/..;/elsewhere",  # `..` to Tomcat and Spring
    ):
        response = httpx.post(
            f"{hook_stack.base_url}/v1/batches",
            params={"model": "identity", "webhook": url},
            content=_lines(1),
        )
        assert response.status_code == 422, url
        assert "ALLOWLIST" in response.json()["error"]["message"]


def test_allow_list_matching() -> None:
    rules = ["https://hooks.example.com/conveyor", "https://*.acme.io", "http://10.0.0.5:8080/"]
    assert allowed("https://hooks.example.com/conveyor/batches?x=1", rules)
    assert allowed("https://hooks.example.com/conveyor", rules)
    assert not allowed("https://hooks.example.com/conveyorx", rules)
    assert not allowed("https://hooks.example.com:8443/conveyor/", rules)
    assert allowed("https://a.b.acme.io/any", rules)
    assert not allowed("https://acme.io/", rules)
    assert not allowed("https://evilacme.io/", rules)
    assert allowed("http://10.0.0.5:8080/x", rules)
    assert not allowed("http://10.0.0.5/x", rules)
    assert not allowed("ftp://hooks.example.com/conveyor/", rules)
    assert not allowed("https://hooks.example.com/conveyor/#frag", rules)
    assert not allowed("https://a..acme.io/", rules)  # an empty label: no request can go there
    slashed = ["https://hooks.example.com/conveyor/"]
    assert allowed("https://hooks.example.com/conveyor/", slashed)  # the URL the entry names
    assert allowed("https://hooks.example.com/conveyor/jobs", slashed)
    assert not allowed("https://hooks.example.com/conveyor/../admin/", slashed)
    assert not allowed("https://hooks.example.com/conveyorx/", slashed)
    assert not allowed("https://hooks.example.com/conveyor/..;/manager", slashed)


def test_a_url_on_port_zero_is_refused_at_submit() -> None:
    """Port 0 read as the scheme's default (`parts.port or 80`): `http://host:0/` passed the
    allow-list's `http://host` at submit with a 202, then every attempt connected to port 0 and
    failed, retried for CONVEYOR_WEBHOOK_RETRY_FOR_S with the event never delivered."""
    rules = ["http://hooks.example.com", "https://hooks.example.com:443/conveyor"]
    assert allowed("http://hooks.example.com:80/x", rules)  # the default port, written out
    assert not allowed("http://hooks.example.com:0/x", rules)
    assert not allowed("https://hooks.example.com:0/conveyor/x", rules)
    assert not allowed("http://hooks.example.com:00/x", rules)


@pytest.mark.parametrize(
    "path",
    [
        "/admin//..//conveyor/x",  # checked as /conveyor/x, sent as /admin//conveyor/x
        "/conveyor//x",  # an empty segment: receivers that merge slashes resolve `..` after it
        "/conveyor/%2e%2e/admin",  # escaped dots, separators and backslashes are sent as they
        "/conveyor/%2E%2E/admin",  # are, and a receiver may decode them into segments the
        "/conveyor/x%2F..%2F..%2Fadmin",  # check never saw
        "/conveyor/x%2f..%2f..%2fadmin",
        "/conveyor/x%5C..%5C..%5Cadmin",
        "/conveyor/x%5c..%5c..%5cadmin",
        "/conveyor/x\\..\\..\\admin",
        "/conveyor/..;/manager/html",  # Tomcat and Spring strip `;params`, then resolve `..`
        "/conveyor/..;jsessionid=1/manager",
        "/conveyor/..%3B/manager",
    ],
)
def test_allow_list_refuses_paths_a_receiver_may_read_otherwise(path: str) -> None:
    """The check normalised the path its own way (posixpath.normpath drops empty segments
    before `..`, and it decoded `%2e`), not as the HTTP client sends it: a URL checked as
    inside the allowed prefix reached another path of the receiver."""
    rules = ["https://hooks.example.com/conveyor"]
    assert not allowed(f"https://hooks.example.com{path}", rules)


def test_allow_list_checks_the_path_the_http_client_sends() -> None:
    rules = ["https://hooks.example.com/conveyor"]
    assert allowed("https://hooks.example.com/other/../conveyor/x", rules)  # sent: /conveyor/x
    assert allowed("https://hooks.example.com/conveyor/./a/../b?next=//x", rules)
    assert allowed("https://hooks.example.com/conveyor/%41%252e", rules)  # no `.` once sent
    assert not allowed("https://hooks.example.com/conveyor/..", rules)  # sent: /


def test_signatures_reject_tampering_and_stale_timestamps() -> None:
    body = b'{"id": "evt_1"}'
    header = sign(SECRET, body, timestamp=1_000_000)
    assert verify(SECRET, body, header, now=1_000_100) == 1_000_000
    for secret, payload, now in (
        ("other-secret", body, 1_000_100),
        (SECRET, body + b" ", 1_000_100),
        (SECRET, body, 1_000_301),
    ):
        with pytest.raises(InvalidSignature):
            verify(secret, payload, header, tolerance_s=300, now=now)
    with pytest.raises(InvalidSignature):
        verify(SECRET, body, "v1=abc")
    for hostile in ("t=1000000,v1=\u00e9t\u00e9", "t=\u00b2,v1=ab", f"t={'9' * 5000},v1=ab"):
        with pytest.raises(InvalidSignature):  # not a TypeError or ValueError: a 500
            verify(SECRET, body, hostile, now=1_000_100)


def test_job_webhooks_fire_once_on_success_and_on_cancel(
    hook_stack: Stack, receiver: Receiver
) -> None:
    url = f"{receiver.base}/hooks/jobs"
    done = httpx.post(
        f"{hook_stack.base_url}/v1/jobs",
        json={"model": "identity", "inputs": {"n": 1}, "webhook": url},
        params={"wait": 30},
        timeout=60,  # past the wait: httpx's default 5 s cut a long-poll on a loaded machine
    ).json()
    assert done["status"] == "succeeded"
    queued = httpx.post(
        f"{hook_stack.base_url}/v1/jobs",
        json={"model": "identity", "variant": "canary", "inputs": {}, "webhook": url},
    ).json()
    httpx.delete(f"{hook_stack.base_url}/v1/jobs/{queued['id']}")

    def two_deliveries() -> list[dict[str, Any]] | None:
        got = receiver.at("/hooks/jobs")
        return got if len(got) >= 2 else None

    deliveries = until(two_deliveries)
    for delivery in deliveries:
        verify(DEFAULT_KEY, delivery["body"], delivery["headers"][HEADER])
    events = {json.loads(d["body"])["data"]["id"]: json.loads(d["body"]) for d in deliveries}
    assert events[done["id"]]["type"] == "job.succeeded"
    assert events[done["id"]]["data"]["outputs"] == {"n": 1}
    assert events[queued["id"]]["type"] == "job.cancelled"
    time.sleep(1.0)
    assert len(receiver.at("/hooks/jobs")) == 2
    refused = httpx.post(
        f"{hook_stack.base_url}/v1/jobs",
        json={"model": "identity", "inputs": {}, "webhook": "http://169.254.169.254/x"},
    )
    assert refused.status_code == 422 and "ALLOWLIST" in refused.json()["error"]["message"]


def test_a_tenants_event_is_signed_with_its_own_key_and_names_it(
    hook_stack: Stack, receiver: Receiver
) -> None:
    """Every delivery was signed with the one CONVEYOR_WEBHOOK_SECRET that every receiver
    held: tenant b's receiver took tenant a's job, pointed at its URL, for one of its own, and
    any receiver could forge any event. Tenant a's job event is signed with a's key only. A
    second producer, with keys, on the same stack (its worker delivers)."""
    authed = hook_stack.start_producer(free_port(), "producer-keys", CONVEYOR_AUTH="enabled")
    key = issue_key(hook_stack.redis_url, "a", "submit", "read")
    done = httpx.post(
        f"{authed}/v1/jobs",
        json={"model": "identity", "inputs": {}, "webhook": f"{receiver.base}/hooks/tenant"},
        params={"wait": 30},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ).json()
    assert done["status"] == "succeeded", done
    (delivery,) = until(lambda: receiver.at("/hooks/tenant"))
    body, header = delivery["body"], delivery["headers"][HEADER]
    assert json.loads(body)["tenant"] == "a"
    verify(owner_secret(SECRET, "a"), body, header)
    for other in (SECRET, owner_secret(SECRET, "b"), DEFAULT_KEY):
        with pytest.raises(InvalidSignature):
            verify(other, body, header)


def test_the_cli_prints_the_key_a_tenants_receiver_verifies_with(
    settings_env: Callable[..., None],
) -> None:
    settings_env(CONVEYOR_WEBHOOK_SECRET=SECRET)
    for args, owner in ((["--tenant", "a"], "a"), (["--operator"], OPERATOR)):
        printed = CliRunner().invoke(keys_command, ["webhook-secret", *args])
        assert printed.exit_code == 0, printed.output
        assert printed.output.strip() == owner_secret(SECRET, owner)


def test_an_event_that_names_no_owner_is_signed_with_the_operators_secret(
    settings_env: Callable[..., None], receiver: Receiver
) -> None:
    """One handed over by a producer or worker of an older release, still queued in the broker
    during a rolling upgrade, is signed as that release signed it."""
    settings_env(CONVEYOR_WEBHOOK_SECRET=SECRET)
    event = {"id": "evt_older", "type": "job.succeeded", "created": 0, "data": {}}
    body = json.dumps(event).encode()
    attempt = webhook_delivery._post(f"{receiver.base}/hooks/older", body, event)
    assert attempt["status_code"] == 200, attempt
    (delivery,) = receiver.at("/hooks/older")
    verify(SECRET, delivery["body"], delivery["headers"][HEADER])


def test_while_the_secret_is_rotated_a_delivery_verifies_with_the_old_key_and_the_new(
    settings_env: Callable[..., None], receiver: Receiver
) -> None:
    """With CONVEYOR_WEBHOOK_PREVIOUS_SECRET set, each delivery carries a signature by the
    owner's key from either secret: a receiver not yet given its new key loses no event."""
    settings_env(CONVEYOR_WEBHOOK_SECRET="whsec-new", CONVEYOR_WEBHOOK_PREVIOUS_SECRET=SECRET)
    for owner in ("a", None):  # a tenant's event, and one of an older release's (no owner)
        event = {"id": f"evt_{owner}", "type": "job.succeeded", "created": 0, "data": {}}
        event |= {"tenant": owner} if owner else {}
        body = json.dumps(event).encode()
        attempt = webhook_delivery._post(f"{receiver.base}/hooks/rotated", body, event)
        assert attempt["status_code"] == 200, attempt
        delivery = receiver.at("/hooks/rotated")[-1]
        header = delivery["headers"][HEADER]
        keys = [owner_secret(s, owner) if owner else s for s in ("whsec-new", SECRET)]
        for key in keys:
            verify(key, delivery["body"], header)
        with pytest.raises(InvalidSignature):  # another tenant's key, from either secret
            verify(owner_secret(SECRET, "b"), delivery["body"], header)
    settings_env(CONVEYOR_WEBHOOK_PREVIOUS_SECRET="")  # the rotation over: the new key alone
    event = {"id": "evt_after", "type": "job.succeeded", "created": 0, "data": {}, "tenant": "a"}
    body = json.dumps(event).encode()
    after = webhook_delivery._post(f"{receiver.base}/hooks/after", body, event)
    assert after["status_code"] == 200, after
    header = receiver.at("/hooks/after")[0]["headers"][HEADER]
    verify(owner_secret("whsec-new", "a"), body, header)
    with pytest.raises(InvalidSignature):
        verify(owner_secret(SECRET, "a"), body, header)


def test_a_batch_lines_webhook_is_called_when_its_item_is_cancelled(
    hook_stack: Stack, receiver: Receiver
) -> None:
    """A line's webhook reached the payload only, and the cancel reads the job's hash: a batch
    item cancelled alone (or dead-lettered) was never reported."""
    url = f"{receiver.base}/hooks/items"
    line = {"custom_id": "c", "body": {"variant": "canary", "inputs": {}, "webhook": url}}
    created = httpx.post(
        f"{hook_stack.base_url}/v1/batches",
        params={"model": "identity"},
        content=json.dumps(line).encode() + b"\n",
        headers={"Content-Type": "application/jsonl"},
    )
    assert created.status_code == 202, created.text
    client = redis.Redis.from_url(hook_stack.redis_url, decode_responses=True)
    (item,) = client.lrange(Keys().batch_items(created.json()["id"]), 0, -1)
    client.close()
    assert httpx.delete(f"{hook_stack.base_url}/v1/jobs/{item}").status_code == 200
    (delivery,) = until(lambda: receiver.at("/hooks/items"))
    event = json.loads(delivery["body"])
    assert (event["type"], event["data"]["id"]) == ("job.cancelled", item)


async def test_a_cancel_whose_event_the_broker_refuses_still_answers_the_cancelled_job(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel is committed before its webhook event is handed to delivery: a broker that
    refused the event (kombu's OperationalError, once it gave up) answered 500, and the
    client's retry 409. It answers the cancelled job; the lost event is logged, as a worker
    logs one. The producer runs in-process, on a real Valkey."""
    hook = "http://127.0.0.1:9/hooks/cancelled"
    settings = Settings(
        redis_url=redis_url,
        key_prefix="cancel-hook:",  # its own keys: no worker of another test reads its lane
        auth="disabled",
        webhook_secret=SECRET,
        webhook_allowlist=["http://127.0.0.1:9/hooks/"],
    )
    app = create_app(settings)

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("the broker is unreachable")

    async with app.router.lifespan_context(app):
        monkeypatch.setattr(app.state.conveyor.webhooks, "send", refused)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            body = {"model": "identity", "inputs": {}, "webhook": hook}
            created = await client.post("/v1/jobs", json=body)
            assert created.status_code == 202, created.text
            cancelled = await client.delete(f"/v1/jobs/{created.json()['id']}")
            again = await client.get(f"/v1/jobs/{created.json()['id']}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == again.json()["status"] == "cancelled"
