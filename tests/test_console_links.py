"""What an operator met in the console, found by following it: every link it draws leads
somewhere, against a producer and Valkey of this module's own with no worker (a dead letter with
no job id, as RECLAIM dead-letters an entry no worker could read, linked to `/console/jobs/`, a
redirect to the job list, on the Dead letters page and on a replay's page; a running batch's
output and errors links answered a JSON 409, "its files are ready when it ends", drawn by the
page and again every second by its script); on a dual-stack socket every IPv4 client's
logins were counted as one address's; a page drawn, or a feed opened, in a producer's first
moment showed the empty summary that stands before the first is computed; and a job held back
from a fair lane's stream showed no inputs, as if it had run."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from conveyor.stack import Stack
from producer_api.app import build_state, create_app
from producer_api.console.login_throttle import bucket_of
from producer_api.console.summaries import ConsoleSummaries
from shared.keys import Keys
from shared.settings import Settings
from tests.app_client import app_client
from tests.conftest import running_stack, until
from tests.test_console import ARGS, CHROMIUM, playwright_api
from tests.test_security_console import _client, _console, _log_in

KEYS = Keys()
DLQ = KEYS.dlq("identity", "default")
LINK = re.compile(r'<a [^>]*href="(/console[^"]*)"')


@pytest.fixture(scope="module")
def links_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """No worker: jobs and batches stay queued, so a batch is seen running."""
    with running_stack(tmp_path_factory.mktemp("console-links"), CONVEYOR_AUTH="disabled") as stack:
        yield stack


@pytest.fixture
def client(links_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=links_stack.base_url, timeout=10) as http:
        yield http


@pytest.fixture
def r(links_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(links_stack.redis_url, decode_responses=True)
    yield client
    client.close()


def _links(html: str) -> list[str]:
    return [href.replace("&amp;", "&") for href in LINK.findall(html)]


def _broken(client: httpx.Client, html: str) -> dict[str, int]:
    """The links of a page that do not answer 200 (a redirect included: a link to a page
    should be that page), with what they answered."""
    answers = {href: client.get(href).status_code for href in dict.fromkeys(_links(html))}
    return {href: status for href, status in answers.items() if status != 200}


def _undecodable_letter(r: redis.Redis) -> str:
    letter: str = r.xadd(DLQ, {"reason": "unreadable", "deliveries": "3", "junk": "x"})
    return letter


@pytest.mark.slow
def test_a_dead_letter_with_no_job_id_links_to_no_job(client: httpx.Client, r: redis.Redis) -> None:
    letter = _undecodable_letter(r)
    try:
        page = client.get("/console/dead-letters")
        assert page.status_code == 200 and letter in page.text
        assert _broken(client, page.text) == {}
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None
        form = {"partition": "identity:default", "entry": letter, "csrf": csrf[1]}
        done = client.post("/console/dead-letters/replay", data=form)
        assert done.status_code == 200 and "(undecodable)" in done.text  # kept, and why
        assert _broken(client, done.text) == {}
    finally:
        r.xdel(DLQ, letter)


def _running_batch(client: httpx.Client) -> str:
    lines = "".join(
        f'{{"custom_id": "c{n}", "body": {{"inputs": {{"n": {n}}}}}}}\n' for n in range(2)
    )
    response = client.post(
        "/v1/batches",
        params={"model": "identity"},
        content=lines.encode(),
        headers={"content-type": "application/jsonl"},
    )
    assert response.status_code == 202, response.text
    batch_id: str = response.json()["id"]
    return batch_id


@pytest.mark.slow
def test_a_running_batch_offers_no_file_links_yet(client: httpx.Client) -> None:
    batch_id = _running_batch(client)
    page = until(lambda: (shown := client.get("/console/batches")).text.count(batch_id) and shown)
    assert re.search(
        rf'data-batch="{batch_id}"><td class="mono">{batch_id}</td><td>in_progress', page.text
    )
    assert _broken(client, page.text) == {}
    # once ended, the file with lines in it is offered: its cancelled items are errors
    assert client.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
    errors = f"/console/batches/{batch_id}/errors"
    ended = until(lambda: (shown := client.get("/console/batches")).text.count(errors) and shown)
    assert f"/console/batches/{batch_id}/output" not in ended.text  # nothing succeeded
    assert _broken(client, ended.text) == {}


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_the_live_batches_table_offers_no_file_links_for_a_running_batch(
    links_stack: Stack, client: httpx.Client
) -> None:
    """The page's script redraws the table every second: it drew the links again."""
    batch_id = _running_batch(client)
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            tab: Any = browser.new_page()
            tab.goto(f"{links_stack.base_url}/console/batches")
            row = tab.locator(f'tr[data-batch="{batch_id}"]')
            until(lambda: row.count() == 1, timeout=15)
            drawn = tab.evaluate("document.body.dataset.updated || ''")
            until(lambda: tab.evaluate("document.body.dataset.updated || ''") != drawn, timeout=15)
            assert "in_progress" in row.inner_text()
            hrefs = row.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
            for href in hrefs:
                assert client.get(href).status_code == 200, href
        finally:
            browser.close()


def test_an_ipv4_client_of_a_dual_stack_socket_is_counted_as_its_own_address() -> None:
    """`conveyor up --host ::` binds one AF_INET6 socket that IPv4 clients reach too, as
    `::ffff:a.b.c.d`: every one of them fell in the /64 `::`, one bucket for all."""
    assert bucket_of("::ffff:10.1.2.3") == "10.1.2.3"
    assert bucket_of("::ffff:10.1.2.3") != bucket_of("::ffff:192.0.2.7")


async def test_one_ipv4_guesser_locks_no_other_ipv4_client_out(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The address's guesses hold back only its own logins, the right key's included."""
    async with (
        _console(redis_url, aredis, console_login_failures_per_minute=2) as (app, key),
        _client(app, "::ffff:10.0.0.1") as guesser,
        _client(app, "::ffff:10.0.0.2") as other,
    ):
        for attempt in range(3):
            await _log_in(guesser, f"cvk_guess{attempt}")
        assert (await _log_in(guesser, key)).status_code == 429
        signed = await _log_in(other, key)
        assert signed.status_code == 303, signed.text


async def test_an_overview_drawn_as_the_producer_starts_has_its_partitions(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The page's script updates the rows the page drew and adds none: drawn from the empty
    summary that stands before the first, the Overview stayed empty until reloaded."""
    settings = Settings(redis_url=redis_url, key_prefix="console-first:", auth="disabled")
    app = create_app(settings)
    async with app_client(app) as client:
        page = await client.get("/console")  # before the summaries loop's first look ends
    partitions = sum(len(config.variants) for config in app.state.conveyor.repository)
    assert partitions and page.text.count("data-partition=") == partitions


async def test_a_feed_opened_as_the_producer_starts_sends_no_empty_summary(
    redis_url: str, aredis: aioredis.Redis
) -> None:
    """The placeholder drew "No live workers" and no batches over a full page, dot green."""
    state = build_state(Settings(redis_url=redis_url, key_prefix="console-first:"))
    summaries = ConsoleSummaries(state)
    summaries.start()
    try:
        first = await anext(aiter(summaries.follow()))
        assert first["at"] > 0 and first["partitions"]
    finally:
        await summaries.stop()
        await state.redis.aclose()


FAIR_MODEL = """\
kind: batch
backend: identity
input_schema: {type: object}
max_batch_size: 4
queue: {fair: true, fair_window: 1}
variants:
  default: {weight: 100}
"""


async def submit_two_one_held(client: httpx.AsyncClient) -> list[str]:
    """Two jobs of FAIR_MODEL: the first fills the stream's window of one, the second is held."""
    ids = []
    for n in range(2):
        response = await client.post("/v1/jobs", json={"model": "fair", "inputs": {"n": n}})
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def test_a_job_held_back_from_a_fair_lane_shows_its_inputs(
    redis_url: str, aredis: aioredis.Redis, tmp_path: Path
) -> None:
    """Its entry waits packed in its tenant's held list, in no stream yet: the page said its
    inputs were gone once it ran."""
    (tmp_path / "fair").mkdir()
    (tmp_path / "fair" / "config.yaml").write_text(FAIR_MODEL)
    keys = Keys("console-held:")
    settings = Settings(
        redis_url=redis_url,
        key_prefix=keys.prefix,
        auth="disabled",
        model_repository=str(tmp_path),
    )
    async with app_client(create_app(settings)) as client:
        ids = await submit_two_one_held(client)
        assert await aredis.hget(keys.job(ids[1]), "held")
        page = await client.get(f"/console/jobs/{ids[1]}")
    assert page.status_code == 200
    inputs = re.search(r'id="job-inputs">([^<]*)<', page.text)
    assert inputs is not None, page.text
    assert json.loads(html.unescape(inputs[1]))["inputs"] == {"n": 1}
