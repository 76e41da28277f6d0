"""The operator console behind a reverse proxy that strips a path prefix and ends TLS, as nginx's
`location /conveyor/ { proxy_pass http://producer/; }` does: its links, forms, redirects, live
feeds and cookie path were `/console/...`, out of the prefix (the proxy's 404, a cookie the
browser never sent back), and its session cookie was not Secure behind TLS offload. The console's
prefix is the path of CONVEYOR_PUBLIC_URL, else the request's ASGI root_path (uvicorn
--root-path); its cookies are Secure where the public URL or the request is https."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from playwright.sync_api import expect
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.stack import free_port
from tests.conftest import issue_key, running_stack
from tests.local_http import served_app
from tests.test_console import CHROMIUM, browser  # noqa: F401  (the module's browser fixture)
from tests.test_security_console import _console, _log_in

PREFIX = "/conveyor"
# what a proxy answers for itself: never passed on, as nginx drops them
HOP_BY_HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
URL = re.compile(r'(?:href|src|action)="([^"]*)"')


class StrippingProxy:
    """nginx's `location /conveyor/ { proxy_pass http://producer/; }`: a request under the
    prefix goes to `upstream` with the prefix cut and the upstream's own Host, its answer
    streamed back untouched (Location and Set-Cookie as the producer wrote them); any other
    path is the proxy's 404."""

    def __init__(self, upstream: httpx.AsyncClient) -> None:
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["raw_path"].decode("latin-1")
        if scope["type"] != "http" or not path.startswith(f"{PREFIX}/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"proxy: not found"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        request = self.upstream.build_request(
            scope["method"],
            path.removeprefix(PREFIX),
            params=scope["query_string"].decode("latin-1"),
            headers=headers,
            content=body,
        )
        async with anyio.create_task_group() as group:
            group.start_soon(self._until_gone, receive, group.cancel_scope)
            await self._relay(request, send)
            group.cancel_scope.cancel()

    async def _relay(self, request: httpx.Request, send: Send) -> None:
        answer = await self.upstream.send(request, stream=True)
        try:
            headers = [(k, v) for k, v in answer.headers.raw if k.lower() not in HOP_BY_HOP]
            await send(
                {"type": "http.response.start", "status": answer.status_code, "headers": headers}
            )
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await answer.aclose()

    @staticmethod
    async def _until_gone(receive: Receive, scope: anyio.CancelScope) -> None:
        """Ends the relay once the browser left (a live feed's tab closed)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


def _behind_proxy(upstream: ASGIApp) -> httpx.AsyncClient:
    """A client of the in-process producer `upstream` as a browser sees it behind the proxy, at
    https://example.com/conveyor: its cookie jar keeps each cookie's path and Secure flag."""
    producer = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream), base_url="http://p")
    proxy = httpx.ASGITransport(app=StrippingProxy(producer))
    return httpx.AsyncClient(transport=proxy, base_url=f"https://example.com{PREFIX}")


def _cookies(answer: httpx.Response) -> dict[str, set[str]]:
    """Each cookie the answer sets, by name, with its attributes (lower case)."""
    cookies = {}
    for line in answer.headers.get_list("set-cookie"):
        name, *attributes = line.split(";")
        cookies[name.partition("=")[0]] = {a.strip().lower() for a in attributes}
    return cookies


async def test_behind_a_tls_offloading_proxy_the_console_stays_under_its_prefix(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    public = {"public_url": f"https://example.com{PREFIX}/"}
    async with _console(redis_url, aredis, **public) as (app, key), _behind_proxy(app) as client:
        unsigned = await client.get("/console/jobs")
        assert (unsigned.status_code, unsigned.headers["location"]) == (
            303,
            "/conveyor/console/login",
        )
        form = await client.get("/console/login")
        assert _cookies(form)["conveyor_console_login"] >= {"path=/conveyor/console", "secure"}
        signed = await _log_in(client, key)
        assert (signed.status_code, signed.headers["location"]) == (303, "/conveyor/console")
        session = _cookies(signed)["conveyor_console"]
        assert {"path=/conveyor/console", "secure", "httponly", "samesite=strict"} <= session
        assert "path=/conveyor/console" in _cookies(signed)["conveyor_console_login"]  # dropped
        overview = await client.get("/console")
        assert overview.status_code == 200, overview.text
        assert 'data-base="/conveyor"' in overview.text
        outside = [
            url for url in URL.findall(overview.text) if not url.startswith("/conveyor/console")
        ]
        assert outside == []
        found = await client.get("/console/jobs", params={"id": "j-1"})
        assert found.headers["location"] == "/conveyor/console/jobs/j-1"
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', overview.text)
        assert csrf is not None
        out = await client.post("/console/logout", data={"csrf": csrf[1]})
        assert (out.status_code, out.headers["location"]) == (303, "/conveyor/console/login")
        assert "path=/conveyor/console" in _cookies(out)["conveyor_console"]
        assert (await client.get("/console")).status_code == 303  # the jar dropped the session


async def test_under_an_asgi_root_path_the_console_keeps_it_and_its_headers(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """uvicorn --root-path /conveyor, with no public URL: the path the app is given starts with
    the root path, which the router reads past; the security headers were left off."""
    async with _console(redis_url, aredis) as (app, _):
        transport = httpx.ASGITransport(app=app, root_path=PREFIX)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://t{PREFIX}") as client:
            form = await client.get("/console/login")
            unsigned = await client.get("/console/workers")
    assert form.status_code == 200, form.text
    assert "frame-ancestors 'none'" in form.headers.get("content-security-policy", "")
    assert _cookies(form)["conveyor_console_login"] >= {"path=/conveyor/console"}
    assert "secure" not in _cookies(form)["conveyor_console_login"]  # plain http, no public URL
    assert [url for url in URL.findall(form.text) if not url.startswith("/conveyor/console")] == []
    assert unsigned.headers["location"] == "/conveyor/console/login"


@pytest.fixture(scope="module")
def proxied_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A producer with no worker (jobs stay queued) and the proxy in front of it: the console's
    address through the proxy, and an admin key (issued before the browser's sync loop runs)."""
    port = free_port()
    public_url = f"http://127.0.0.1:{port}{PREFIX}"
    folder = tmp_path_factory.mktemp("behind-proxy")
    with running_stack(folder, CONVEYOR_AUTH="enabled", CONVEYOR_PUBLIC_URL=public_url) as stack:
        upstream = httpx.AsyncClient(base_url=stack.base_url, timeout=httpx.Timeout(10, read=None))
        with served_app(StrippingProxy(upstream), port, lifespan="off"):
            yield public_url, issue_key(stack.redis_url, "ops", "admin")


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_the_console_works_in_a_browser_behind_a_path_stripping_proxy(
    proxied_stack: tuple[str, str],
    browser: Any,  # noqa: F811
) -> None:
    public_url, key = proxied_stack
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(f"{public_url}/console")
        tab.wait_for_url(f"{public_url}/console/login")
        tab.fill("#key", key)
        tab.click("button[type=submit]")
        tab.wait_for_url(f"{public_url}/console")
        length = tab.locator('tr[data-partition="identity:default"] [data-field="online.length"]')
        expect(length).to_have_text("0")
        expect(tab.locator("#live")).to_have_class(re.compile(r"\bon\b"))  # the feed, live
        submitted = httpx.post(
            f"{public_url}/v1/jobs",
            json={"model": "identity", "inputs": {"n": 1}},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert submitted.status_code == 202, submitted.text
        expect(length).to_have_text("1")  # drawn by the live feed, the page not reloaded
        tab.click("nav >> text=Jobs")
        tab.wait_for_url(f"{public_url}/console/jobs")
        expect(tab.locator("#jobs")).to_contain_text(submitted.json()["id"])
        tab.click("text=Log out")
        tab.wait_for_url(f"{public_url}/console/login")
        tab.goto(f"{public_url}/console/jobs")
        tab.wait_for_url(f"{public_url}/console/login")  # the session ended
    finally:
        context.close()
