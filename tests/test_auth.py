"""Who may do what, against a real producer with auth on: every route but the probes needs a
key (401), the key needs the route's scope (403), a tenant never sees another's jobs (404, as if
they did not exist), expired and revoked keys stop working at once, and Redis holds no key in
plain text. Routes are taken from the live OpenAPI, so a route added later is covered too."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from conveyor.stack import Stack
from shared.keys import Keys
from tests.conftest import issue_key

KEYS = Keys("cv:")

pytestmark = pytest.mark.slow
CONVEYOR = Path(sys.executable).parent / "conveyor"
OPEN_PATHS = {"/healthz", "/readyz"}
JOB = {"model": "identity", "inputs": {"x": 1}}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _operations(base_url: str) -> list[tuple[str, str]]:
    """(method, path) of every operation the producer documents."""
    spec = httpx.get(f"{base_url}/openapi.json").json()
    return [(method.upper(), path) for path, ops in spec["paths"].items() for method in ops]


def _concrete(path: str, job_id: str | None = None) -> str:
    """A path with plausible values for its parameters (shaped like real ids)."""
    values = {
        "job_id": job_id or uuid.uuid4().hex,
        "model": "identity",
        "batch_id": f"batch_{uuid.uuid4().hex}",
    }
    for name, value in values.items():
        path = path.replace(f"{{{name}}}", value)
    return path


def _call(
    client: httpx.Client, method: str, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = JOB if path == "/v1/jobs" else {"inputs": {"x": 1}}
    # No worker serves these jobs: a submit-and-wait gives up at once instead of after 30 s.
    kwargs: dict[str, Any] = {"headers": headers or {}, "params": {"timeout": 0.01}}
    if method in ("POST", "PUT", "PATCH"):
        kwargs["json"] = body
    return client.request(method, path, **kwargs)


def _needs(method: str, path: str) -> str:
    """The scope a route asks for: admin routes (and a model's traffic: its routes and
    canary) `admin`, reads `read`, everything else (submit, cancel) `submit`."""
    if path.startswith("/v1/admin") or path.endswith(("/routes", "/canary")):
        return "admin"
    return "read" if method == "GET" else "submit"


@pytest.fixture(scope="module")
def api(auth_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=auth_stack.base_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def keys(auth_stack: Stack) -> dict[str, str]:
    url = auth_stack.redis_url
    return {
        "acme": issue_key(url, "acme", "submit", "read"),
        "beta": issue_key(url, "beta", "submit", "read"),
        "reader": issue_key(url, "acme", "read"),
        "submitter": issue_key(url, "acme", "submit"),
    }


def _protected(base_url: str) -> list[tuple[str, str]]:
    operations = _operations(base_url)
    assert ("POST", "/v1/jobs") in operations and ("GET", "/v1/jobs/{job_id}") in operations
    return [(m, p) for m, p in operations if p not in OPEN_PATHS]


def test_every_route_without_a_key_is_401(auth_stack: Stack, api: httpx.Client) -> None:
    for method, path in _protected(auth_stack.base_url):
        for headers in ({}, _bearer("cvk_not-a-real-key-at-all"), {"X-API-Key": "short"}):
            response = _call(api, method, _concrete(path), headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            challenge = 'Bearer error="invalid_token"' if headers else "Bearer"
            assert response.headers["www-authenticate"] == challenge
            assert response.json()["error"]["type"] == "unauthorized"
    for path in (*OPEN_PATHS, "/metrics"):
        assert api.get(path).status_code == 200, path


def test_wrong_scope_is_403_and_right_scope_passes(
    auth_stack: Stack, api: httpx.Client, keys: dict[str, str]
) -> None:
    holders = {"read": keys["reader"], "submit": keys["submitter"]}
    for method, path in _protected(auth_stack.base_url):
        needed = _needs(method, path)
        for scope, key in holders.items():
            response = _call(api, method, _concrete(path), _bearer(key))
            if scope == needed:
                assert response.status_code not in (401, 403, 500), (method, path, response.text)
            else:
                assert response.status_code == 403, (method, path, scope, response.text)
                assert response.json()["error"]["type"] == "forbidden"


def test_another_tenants_job_is_404_on_every_job_route(
    auth_stack: Stack, api: httpx.Client, keys: dict[str, str]
) -> None:
    accepted = api.post("/v1/jobs", json=JOB, headers=_bearer(keys["acme"]))
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    unknown = api.get(f"/v1/jobs/{uuid.uuid4().hex}", headers=_bearer(keys["beta"])).json()
    job_routes = [(m, p) for m, p in _protected(auth_stack.base_url) if "{job_id}" in p]
    assert {("GET", "/v1/jobs/{job_id}"), ("DELETE", "/v1/jobs/{job_id}")} <= set(job_routes)
    for method, path in job_routes:
        response = _call(api, method, _concrete(path, job_id), _bearer(keys["beta"]))
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["type"] == unknown["error"]["type"] == "not_found"
    owner = api.get(f"/v1/jobs/{job_id}", headers=_bearer(keys["acme"]))
    assert owner.status_code == 200 and owner.json()["status"] == "queued"
    cancelled = api.delete(f"/v1/jobs/{job_id}", headers=_bearer(keys["acme"]))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def test_idempotency_keys_are_per_tenant(api: httpx.Client, keys: dict[str, str]) -> None:
    header = {"Idempotency-Key": f"retry-{uuid.uuid4().hex}"}
    ids: dict[str, set[str]] = {}
    for tenant in ("acme", "beta"):
        for _ in range(2):
            response = api.post("/v1/jobs", json=JOB, headers={**_bearer(keys[tenant]), **header})
            assert response.status_code in (200, 202), response.text
            ids.setdefault(tenant, set()).add(response.json()["id"])
    assert len(ids["acme"]) == len(ids["beta"]) == 1
    assert ids["acme"] != ids["beta"]


def test_x_api_key_header_and_bearer_both_work(api: httpx.Client, keys: dict[str, str]) -> None:
    for headers in (_bearer(keys["acme"]), {"X-API-Key": keys["acme"]}):
        assert api.get("/v1/models", headers=headers).status_code == 200


def test_model_allow_list(auth_stack: Stack, api: httpx.Client) -> None:
    key = issue_key(auth_stack.redis_url, "gamma", "submit", "read", models=frozenset({"identity"}))
    minilm = {"model": "minilm", "inputs": {"texts": ["hi"]}}
    refused = api.post("/v1/jobs", json=minilm, headers=_bearer(key))
    assert refused.status_code == 403, refused.text
    assert api.post("/v1/jobs", json=JOB, headers=_bearer(key)).status_code == 202
    listed = api.get("/v1/models", headers=_bearer(key)).json()
    assert [card["id"] for card in listed["data"]] == ["identity"]
    # an OpenAI route says no more of a model the key may not use (it answered 400, "does not
    # generate text": what kind of model it is)
    chat = {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]}
    refused = api.post("/v1/chat/completions", json=chat, headers=_bearer(key))
    assert refused.status_code == 403, refused.text


def test_one_model_reads_as_the_list_shows_it(
    auth_stack: Stack, api: httpx.Client, keys: dict[str, str]
) -> None:
    """`GET /v1/models/{model}` (OpenAI's retrieve-model call) answers the list's card of that
    model; one the key may not use is 403 (as a submit to it is), an unknown one 404."""
    headers = _bearer(keys["reader"])
    listed = api.get("/v1/models", headers=headers).json()["data"]
    assert {card["id"] for card in listed} == {"identity", "minilm", "smollm2"}
    for card in listed:
        response = api.get(f"/v1/models/{card['id']}", headers=headers)
        assert response.status_code == 200, response.text
        one = response.json()
        # queued jobs age between the two reads: everything else must be the same
        for partition in (*card["partitions"], *one["partitions"]):
            partition.pop("oldest_queued_age_s")
        assert one == card
    unknown = api.get("/v1/models/nope", headers=headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    narrow = issue_key(auth_stack.redis_url, "gamma", "read", models=frozenset({"identity"}))
    refused = api.get("/v1/models/minilm", headers=_bearer(narrow))
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    assert api.get("/v1/models/identity", headers=_bearer(narrow)).status_code == 200


def test_expired_key_is_401(auth_stack: Stack, api: httpx.Client) -> None:
    soon = issue_key(auth_stack.redis_url, "acme", "read", expires_at=time.time() + 1.5)
    assert api.get("/v1/models", headers=_bearer(soon)).status_code == 200
    time.sleep(1.6)
    expired = api.get("/v1/models", headers=_bearer(soon))
    assert expired.status_code == 401
    assert expired.json()["error"]["message"] == "API key expired"


def _cli(auth_stack: Stack, *args: str) -> str:
    env = {**os.environ, "CONVEYOR_REDIS_URL": auth_stack.redis_url}
    done = subprocess.run(
        [str(CONVEYOR), "keys", *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_cli_create_list_revoke(auth_stack: Stack, api: httpx.Client) -> None:
    created = json.loads(
        _cli(auth_stack, "create", "--tenant", "delta", "--scope", "read", "--json")
    )
    key, key_id = created["key"], created["key_id"]
    assert created["scopes"] == ["read"] and created["state"] == "active"
    assert api.get("/v1/models", headers=_bearer(key)).status_code == 200
    listing = _cli(auth_stack, "list", "--json")
    assert key_id in listing and key not in listing
    assert _cli(auth_stack, "revoke", key_id).strip() == f"revoked {key_id}"
    revoked = api.get("/v1/models", headers=_bearer(key))
    assert revoked.status_code == 401
    assert revoked.json()["error"]["message"] == "API key revoked"
    states = [json.loads(line) for line in _cli(auth_stack, "list", "--json").splitlines()]
    assert {"key_id": key_id, "state": "revoked"}.items() <= next(
        s for s in states if s["key_id"] == key_id
    ).items()


def _everything_stored(client: redis.Redis) -> bytes:
    """Every key name and value in the database, whatever its type, as one blob."""
    r: Any = client  # redis-py types sync replies as unions with awaitables
    readers: dict[bytes, Callable[[bytes], list[Any]]] = {
        b"string": lambda k: [r.get(k)],
        b"hash": lambda k: [p for kv in r.hgetall(k).items() for p in kv],
        b"set": lambda k: list(r.smembers(k)),
        b"zset": lambda k: [m for m, _ in r.zrange(k, 0, -1, withscores=True)],
        b"list": lambda k: list(r.lrange(k, 0, -1)),
        b"stream": lambda k: [p for _, f in r.xrange(k) for kv in f.items() for p in kv],
    }
    blob: list[bytes] = []
    for name in r.scan_iter(count=1000):
        blob.append(name)
        blob.extend(v for v in readers[r.type(name)](name) if isinstance(v, bytes))
    return b"\n".join(blob)


def test_keys_are_stored_hashed_and_never_logged(
    auth_stack: Stack, api: httpx.Client, keys: dict[str, str]
) -> None:
    for key in keys.values():  # used at least once, so any logging of it would have happened
        api.get("/v1/models", headers=_bearer(key))
    client = redis.Redis.from_url(auth_stack.redis_url)
    try:
        stored = _everything_stored(client)
        for key in keys.values():
            digest = hashlib.sha256(key.encode()).hexdigest()
            assert key.encode() not in stored
            assert client.hget(KEYS.api_key(digest[:16]), "digest") == digest.encode()
    finally:
        client.close()
    log = (auth_stack.log_dir / "producer.log").read_text()
    assert not [key for key in keys.values() if key in log]


def test_a_batch_for_a_model_the_key_may_not_use_is_403(
    auth_stack: Stack, api: httpx.Client
) -> None:
    """As a job's submit to it is: it was a 202, a batch whose every line was refused."""
    narrow = issue_key(
        auth_stack.redis_url, "delta", "submit", "read", models=frozenset({"identity"})
    )
    line = b'{"custom_id": "a", "body": {"inputs": {"texts": ["hi"]}}}\n'
    headers = {**_bearer(narrow), "Content-Type": "application/jsonl"}
    refused = api.post("/v1/batches", params={"model": "minilm"}, content=line, headers=headers)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["type"] == "forbidden"
    assert api.get("/v1/batches", headers=_bearer(narrow)).json()["data"] == []  # none made
