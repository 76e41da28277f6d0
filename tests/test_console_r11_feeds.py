"""What the console's pages do in a real browser, against a producer served in-process on a real
Valkey: what users and workers wrote shows as text, and a page's live feed (`/console/stream`)
is closed while the page is hidden and opened again when it is shown, counted where the server
counts it, among its key's open streams (a tab left in the background held its place, under
the cap its API clients share, for good)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conveyor.stack import free_port
from producer_api.app import create_app
from shared.api_keys import SCOPES, key_id_of
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.conftest import issue_key, until
from tests.local_http import served_app
from tests.test_console import ARGS, CHROMIUM, playwright_api

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")

HOSTILE = "<img src=x onerror=alert(document.domain)>"
# The browser's page as the browser itself makes it when the tab goes to the background.
SHOW = """(hidden) => {
  Object.defineProperty(document, "hidden", { value: hidden, configurable: true });
  const state = hidden ? "hidden" : "visible";
  Object.defineProperty(document, "visibilityState", { value: state, configurable: true });
  document.dispatchEvent(new Event("visibilitychange"));
}"""


@pytest.fixture(scope="module")
def producer(redis_url: str) -> Iterator[str]:
    """A producer with its console, served over HTTP from a thread of this process."""
    port = free_port()
    app = create_app(Settings(redis_url=redis_url, key_prefix=Keys().prefix))
    with served_app(app, port) as url:
        yield url


@pytest.fixture(scope="module")
def key(redis_url: str) -> str:
    """An admin key, stored before the browser starts (its driver runs an event loop here)."""
    return issue_key(redis_url, "ops", *SCOPES)


@pytest.fixture(scope="module")
def tab(producer: str, key: str) -> Iterator[Any]:
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.dialogs = []  # what a script injected through a page would open
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
        yield page
        browser.close()


def test_a_hidden_pages_feed_gives_its_place_back_and_comes_back_when_shown(
    producer: str, key: str, tab: Any, redis_url: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    places = Keys().open_streams(key_id_of(key))

    def open_feeds() -> int:
        return int(r.zcard(places))

    tab.goto(f"{producer}/console/login")
    tab.fill("#key", key)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{producer}/console")
    # under the 15 s an unrenewed place takes to lapse: only a feed's give-back empties it
    # this soon (3 s was too short for a loaded CI machine)
    within_s = 10
    until(lambda: open_feeds() == 1, timeout=within_s)
    tab.evaluate(SHOW, True)
    until(lambda: open_feeds() == 0, timeout=within_s)
    tab.evaluate(SHOW, False)
    until(lambda: open_feeds() == 1, timeout=within_s)
    r.close()


def test_a_failed_jobs_hostile_error_and_inputs_show_as_text(
    producer: str, tab: Any, redis_url: str
) -> None:
    """Written as a worker writes a failed job (its error's JSON, the inputs it kept): the page
    shows the markup literally and runs none of it."""
    job_id = new_job_id("identity", "default")
    error = {"type": "ValueError", "message": HOSTILE}
    fields = {"model": "identity", "variant": "default", "status": "failed", "tenant": "ops"}
    fields |= {"error": json.dumps(error), "inputs": json.dumps({"text": HOSTILE})}
    with redis.Redis.from_url(redis_url) as r:
        r.hset(Keys().job(job_id), mapping=fields)
    tab.goto(f"{producer}/console/jobs/{job_id}")
    assert HOSTILE in tab.inner_text("#job-error")
    assert HOSTILE in tab.inner_text("#job-inputs")
    assert tab.locator("main img").count() == 0
    tab.wait_for_timeout(200)  # an onerror that ran would have opened its dialog by now
    assert tab.dialogs == []
