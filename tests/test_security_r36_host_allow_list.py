"""With auth disabled every caller is the admin: a web page whose own name resolves to this
machine (DNS rebinding) would be same-origin with the producer, so a request whose Host names no
loopback name, IP literal or CONVEYOR_ALLOWED_HOSTS entry is refused before any route runs."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from producer_api.app import create_app
from producer_api.request_boundary import HOSTS_KEPT, HostAllowList
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client

PREFIX = "r36host:"
QUEUE = Keys(PREFIX).queue("identity", "default")
JOB = {"model": "identity", "inputs": {"text": "hi"}}
SERVED = [
    "localhost:8000",
    "127.0.0.1",
    "[::1]:8000",
    "app.localhost",
    "10.1.2.3:8000",
    "LOCALHOST",
]
# Hosts that look served and are not: a name under another's domain, a bare IPv6 address (a
# Host brackets it), a name longer than DNS allows
LOOKALIKES = [
    "localhost.evil.example",
    "127.0.0.1.nip.io",
    "evillocalhost",
    "::1",
    f"{'a' * 300}.localhost",
]


def _settings(redis_url: str, **overrides: object) -> Settings:
    given = {"auth": "disabled", "instance_id": "r36-host", "key_prefix": PREFIX, **overrides}
    return Settings(redis_url=redis_url, **given)  # type: ignore[arg-type]


async def test_a_rebinding_host_is_refused_before_any_route(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    await aredis.delete(QUEUE)
    async with app_client(create_app(_settings(redis_url))) as client:
        evil = {"Host": "evil.example:8000"}
        submit = await client.post("/v1/jobs", json=JOB, headers=evil)
        console = await client.get("/console", headers=evil)
        models = await client.get("/v1/models", headers=evil)  # answered in OpenAI's shape
        queued_after_refusals = await aredis.xlen(QUEUE)
        served = await client.post("/v1/jobs", json=JOB)  # localhost: the same request is taken
        page = await client.get("/console")
    for refused in (submit, console, models):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["type"] == "invalid_host"
        assert '"evil.example:8000"' in refused.json()["error"]["message"]
    assert 'name="csrf"' in page.text and 'name="csrf"' not in console.text
    assert queued_after_refusals == 0
    assert served.status_code == 202, served.text
    assert await aredis.xlen(QUEUE) == 1


async def test_loopback_names_and_ip_literals_are_served(redis_url: str) -> None:
    async with app_client(create_app(_settings(redis_url))) as client:
        answers = {host: await client.get("/v1/models", headers={"Host": host}) for host in SERVED}
        health = await client.get("/healthz", headers={"Host": "10.0.0.7:8000"})
        lookalikes = [await client.get("/v1/models", headers={"Host": host}) for host in LOOKALIKES]
    assert {host: answer.status_code for host, answer in answers.items()} == dict.fromkeys(
        SERVED, 200
    )
    assert health.status_code == 200, health.text
    assert [answer.status_code for answer in lookalikes] == [400] * len(LOOKALIKES)


async def test_allowed_hosts_are_served_as_listed(redis_url: str) -> None:
    settings = _settings(redis_url, allowed_hosts="Conveyor.LAN, .example.com", host="box")
    async with app_client(create_app(settings)) as client:
        codes = {
            host: (await client.get("/v1/models", headers={"Host": host})).status_code
            for host in ("conveyor.lan:8000", "example.com", "api.example.com", "box", "other.lan")
        }
    assert codes == {
        "conveyor.lan:8000": 200,
        "example.com": 200,
        "api.example.com": 200,
        "box": 200,  # the name it binds (CONVEYOR_HOST), as `conveyor up --host` reaches it
        "other.lan": 400,
    }


async def test_a_star_serves_any_host(redis_url: str) -> None:
    async with app_client(create_app(_settings(redis_url, allowed_hosts="*"))) as client:
        answer = await client.get("/v1/models", headers={"Host": "evil.example"})
    assert answer.status_code == 200, answer.text


async def test_with_auth_enabled_the_key_check_answers_not_the_host(redis_url: str) -> None:
    settings = _settings(redis_url, auth="enabled")
    async with app_client(create_app(settings)) as client:
        answer = await client.post("/v1/jobs", json=JOB, headers={"Host": "evil.example"})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["type"] == "unauthorized"


@pytest.mark.parametrize("entry", ["http://conveyor.lan", "conveyor.lan:8000", "*.example.com"])
def test_an_allowed_host_with_a_scheme_port_or_pattern_is_refused(entry: str) -> None:
    with pytest.raises(ValidationError, match="is not a host name"):
        Settings(allowed_hosts=entry)  # type: ignore[arg-type]


def test_a_request_without_host_is_served_and_the_answers_kept_are_bounded() -> None:
    """No browser leaves Host out (HTTP/1.0 clients may), so its absence is no rebinding page;
    a new Host per request keeps no more than HOSTS_KEPT answers, and an overlong one none."""
    hosts = HostAllowList([])
    assert hosts.refused({"headers": [(b"accept", b"*/*")]}) is None
    assert hosts.refused({"headers": [(b"host", b"evil.example")]}) == "evil.example"
    for n in range(HOSTS_KEPT + 10):
        hosts.allows(f"{n}.evil.example".encode())
    hosts.allows(b"a" * 70_000)
    assert 0 < len(hosts.seen) <= HOSTS_KEPT
    assert b"a" * 70_000 not in hosts.seen
