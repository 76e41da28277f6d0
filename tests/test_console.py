"""The operator console in a real browser (Debian's chromium driven by Playwright): login,
live partition lengths and inline charts, workers, a failed job's error, an LLM job's live
tokens, dead-letter replay, batch progress, escaping of hostile job content, access rules, the
session cookie, CSRF, and the cost of many viewers in Redis."""

from __future__ import annotations

import bisect
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from playwright.sync_api import expect

from conveyor.stack import Stack
from producer_api.console.job_browser import ENTRY_SCAN
from shared.codec import RequestEntry, stream_id
from shared.keys import Keys, new_job_id
from shared.settings import Settings
from tests.conftest import REPO_ROOT, issue_key, running_stack, until
from tests.console_login import console_login
from tests.fault_engine import FIXED_ENV
from tests.test_redis_freeze import frozen

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
KEYS = Keys()
# The console stack's CONVEYOR_STREAM_RECHECK_S (its default): a live feed looks at its session
# this often.
RECHECK_S: float = Settings.model_fields["stream_recheck_s"].default
DLQ = KEYS.dlq("faulty", "default")
FIXTURES = REPO_ROOT / "tests" / "fixtures"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed"),
]


@pytest.fixture(scope="module")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`faulty` (a batch model that fails or crashes on demand) and `paced` (a generate model,
    a token every 50 ms, 3 s to load) in one repository."""
    repository = tmp_path_factory.mktemp("console-models")
    (repository / "faulty").symlink_to(FIXTURES / "model_repository" / "faulty")
    paced = yaml.safe_load((FIXTURES / "paced_repository" / "paced" / "config.yaml").read_text())
    paced["parameters"]["load_ms"] = 3000  # long enough for heartbeats to show it warming
    (repository / "paced").mkdir()
    (repository / "paced" / "config.yaml").write_text(yaml.safe_dump(paced))
    with running_stack(
        tmp_path_factory.mktemp("console"),
        CONVEYOR_MODEL_REPOSITORY=str(repository),
        PYTHONPATH=str(REPO_ROOT),  # both models' engines live in tests/
        OTEL_TRACES_EXPORTER="console",  # spans to the processes' logs: jobs get trace ids
        CONVEYOR_AUTH="enabled",
        CONVEYOR_BLOCK_MS="100",  # workers notice a stop within 0.1 s, not 1 s
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def admin_key(console_stack: Stack) -> str:
    return issue_key(console_stack.redis_url, "ops", "admin")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(admin_key: str, console_stack: Stack, browser: Any) -> Iterator[Any]:
    """One logged-in admin tab for the module; every dialog it opens is recorded."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    tab.goto(f"{console_stack.base_url}/console/login")
    tab.fill("#key", admin_key)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{console_stack.base_url}/console")
    yield tab
    context.close()


def _submit(stack: Stack, key: str, inputs: dict[str, Any], **extra: Any) -> str:
    body = {"model": "faulty", "inputs": inputs} | extra
    response = httpx.post(
        f"{stack.base_url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def _status(r: redis.Redis, job_id: str) -> str:
    return str(r.hget(KEYS.job(job_id), "status") or "")


def _listed(stack: Stack, key: str, **wanted: str) -> str:
    """The job list page for `wanted` filters, fetched beside the browser tab."""
    with httpx.Client(base_url=stack.base_url) as client:
        console_login(client, key)
        return client.get("/console/jobs", params=wanted).text


def _online_length(tab: Any) -> int:
    cell = tab.locator('tr[data-partition="faulty:default"] [data-field="online.length"]')
    return int(cell.inner_text())


def _screenshot(tab: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / name), full_page=True)


@pytest.fixture(scope="module")
def r(console_stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(console_stack.redis_url, decode_responses=True)
    yield client
    client.close()


def test_without_a_session_the_console_redirects_to_login(console_stack: Stack) -> None:
    response = httpx.get(f"{console_stack.base_url}/console/jobs")
    assert response.status_code == 303
    assert response.headers["location"] == "/console/login"
    login = httpx.get(f"{console_stack.base_url}/console/login")
    assert "script-src 'self'" in login.headers["content-security-policy"]
    with httpx.Client(base_url=console_stack.base_url) as client:
        refused = console_login(client, "cvk_wrong-key")
        assert refused.status_code == 401 and "unknown API key" in refused.text
        assert client.get("/console").status_code == 303
    # a cookie or token of non-ASCII text (compare_digest raised TypeError on it: a 500)
    planted = {"Cookie": "conveyor_console=e30.\u00e9".encode()}
    response = httpx.get(f"{console_stack.base_url}/console/jobs", headers=planted)
    assert response.status_code == 303 and response.headers["location"] == "/console/login"
    with httpx.Client(base_url=console_stack.base_url) as client:
        client.get("/console/login")
        forged = client.post("/console/login", data={"key": "cvk_x", "csrf": "\u00e9"})
        assert forged.status_code == 403, forged.text


def test_queue_rises_without_worker_and_drains_when_one_starts(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    """Also leaves a dead letter behind: a crashing entry outlives two workers first."""
    crash = _submit(console_stack, admin_key, {"action": "crash", "tag": "killer"})
    for attempt in range(2):  # max_deliveries is 2: both deliveries crash their worker
        name = f"crash-{attempt}"
        console_stack.start_worker("faulty", name=name)
        worker = console_stack.processes[name]
        until(lambda: worker.poll() is not None, timeout=60)  # noqa: B023
    before = _online_length(page)
    ids = [_submit(console_stack, admin_key, {"n": n}) for n in range(5)]
    until(lambda: _online_length(page) >= before + 5)
    _screenshot(page, "overview.png")
    queued = _listed(console_stack, admin_key, status="queued", model="faulty")
    assert all(job_id in queued for job_id in ids)  # read from the lane's stream
    console_stack.start_worker("faulty", name="fixed", **{FIXED_ENV: "1"})
    until(lambda: _online_length(page) == 0, timeout=60)
    until(lambda: all(_status(r, i) == "succeeded" for i in ids))
    until(lambda: _status(r, crash) == "failed")
    assert crash in _listed(console_stack, admin_key, status="failed")  # dead-lettered
    row = page.locator('tr[data-partition="faulty:default"]')
    until(lambda: float(row.locator('[data-field="rate"]').inner_text()) > 0)  # last minute's
    for chart in ("spark", "throughput"):  # the inline SVG charts got points from the stream
        points = row.locator(f'[data-field="{chart}"] polyline').get_attribute("points")
        assert points is not None and len(points.split()) >= 2, (chart, points)
    # a number, no dash, once the five jobs' samples are sent (the dead letter, counted as an
    # error of the variant, carries none, and may be all the rate counts at first)
    until(lambda: row.locator('[data-field="p99"]').inner_text() != "\u2013")
    assert float(row.locator('[data-field="p99"]').inner_text()) > 0


def test_dead_letter_is_replayed_from_the_ui_and_succeeds(
    console_stack: Stack, page: Any, r: redis.Redis
) -> None:
    page.goto(f"{console_stack.base_url}/console/dead-letters")
    (dead_job,) = [row.get_attribute("data-job") for row in page.locator("tr[data-job]").all()]
    _screenshot(page, "dead_letters.png")
    page.locator(f'tr[data-job="{dead_job}"] a.button', has_text="Replay").click()
    expect(page.locator("h1")).to_contain_text("Replay 1 dead letter of faulty:default?")
    _confirm(page)
    new_job = page.locator("ul.replayed a").inner_text()
    until(lambda: _status(r, new_job) == "succeeded")
    assert r.hget(KEYS.job(new_job), "replay_of") == dead_job
    assert r.xlen(DLQ) == 0


def _confirm(page: Any) -> None:
    """Submit a confirmation and wait for the page its form answers with: read at once, on a
    loaded machine the confirmation could still be showing."""
    with page.expect_navigation():
        page.click("#confirm")


def _dead_letter(r: redis.Redis, inputs: dict[str, Any], deadline_ms: int = 0) -> str:
    """A dead letter as a worker leaves one (the entry, why it died, its deliveries)."""
    job_id, now = new_job_id("faulty", "default"), int(time.time() * 1000)
    entry = RequestEntry(job_id, {"inputs": inputs}, now, deadline_ms)
    reason = "dead-lettered after 2 deliveries without finishing (max_deliveries 2)"
    fields: dict[Any, Any] = {"entry": "1-0", "reason": reason, "deliveries": 2}
    fields |= entry.encode()
    r.xadd(DLQ, fields)
    return entry.job_id


def test_dead_letters_are_replayed_all_at_once_or_discarded_after_a_confirmation(
    console_stack: Stack, page: Any, r: redis.Redis
) -> None:
    for n in range(2):
        _dead_letter(r, {"n": f"dead-{n}"})
    late = _dead_letter(r, {"n": "late"}, deadline_ms=int(time.time() * 1000) - 1)
    page.goto(f"{console_stack.base_url}/console/dead-letters")
    page.locator("a.button", has_text="Replay all").click()
    expect(page.locator("h1")).to_contain_text("Replay 3 dead letters of faulty:default?")
    assert r.xlen(DLQ) == 3  # nothing happens before the confirmation
    _confirm(page)
    replayed = page.locator("ul.replayed a").all_inner_texts()
    assert len(replayed) == 2 and _letters(r) == [late]
    # the letter past its deadline is kept, and the page says so (it listed only the replays)
    assert page.inner_text("#kept") == "Kept 1 dead letter"
    assert page.locator("ul.kept li").all_inner_texts() == [f"{late} (deadline passed)"]
    until(lambda: all(_status(r, job_id) == "succeeded" for job_id in replayed))
    r.xtrim(DLQ, maxlen=0, approximate=False)

    doomed = _dead_letter(r, {"n": "discarded"})
    page.goto(f"{console_stack.base_url}/console/dead-letters")
    page.locator(f'tr[data-job="{doomed}"] a.button', has_text="Discard").click()
    expect(page.locator("h1")).to_contain_text("Discard 1 dead letter of faulty:default?")
    page.click("a.button >> text=Cancel")
    assert r.xlen(DLQ) == 1
    page.locator(f'tr[data-job="{doomed}"] a.button', has_text="Discard").click()
    _confirm(page)
    expect(page.locator("h1")).to_contain_text("Discarded 1 dead letter")
    assert r.xlen(DLQ) == 0 and not r.exists(KEYS.job(doomed))

    for n in range(3):  # the partition's whole queue at once
        _dead_letter(r, {"n": f"purged-{n}"})
    page.goto(f"{console_stack.base_url}/console/dead-letters")
    page.locator("a.button", has_text="Discard all").click()
    expect(page.locator("h1")).to_contain_text("Discard 3 dead letters of faulty:default?")
    assert r.xlen(DLQ) == 3
    _confirm(page)
    expect(page.locator("h1")).to_contain_text("Discarded 3 dead letters")
    assert r.xlen(DLQ) == 0


def _letters(r: redis.Redis) -> list[str]:
    return [fields["id"] for _, fields in r.xrange(DLQ)]


def test_all_is_what_the_confirmation_showed(
    console_stack: Stack, page: Any, r: redis.Redis
) -> None:
    """A letter that died while the operator read "Discard 2 dead letters?" was discarded (or
    replayed) with them: the confirmation acted on the whole stream as it stood at the click."""
    for n in range(2):
        _dead_letter(r, {"n": f"shown-{n}"})
    page.goto(f"{console_stack.base_url}/console/dead-letters")
    page.locator("a.button", has_text="Discard all").click()
    expect(page.locator("h1")).to_contain_text("Discard 2 dead letters of faulty:default?")
    late = _dead_letter(r, {"n": "late"})
    _confirm(page)
    expect(page.locator("h1")).to_contain_text("Discarded 2 dead letters")
    assert _letters(r) == [late]

    page.goto(f"{console_stack.base_url}/console/dead-letters")
    page.locator("a.button", has_text="Replay all").click()
    expect(page.locator("h1")).to_contain_text("Replay 1 dead letter of faulty:default?")
    later = _dead_letter(r, {"n": "later"})
    _confirm(page)
    expect(page.locator("ul.replayed a")).to_have_count(1)
    assert _letters(r) == [later]

    r.xtrim(DLQ, maxlen=0, approximate=False)
    page.goto(
        f"{console_stack.base_url}/console/dead-letters/confirm?action=discard&partition=faulty:default"
    )
    expect(page.locator("h1")).to_contain_text("Discard 0 dead letters of faulty:default?")
    unseen = _dead_letter(r, {"n": "unseen"})
    _confirm(page)
    expect(page.locator("h1")).to_contain_text("Discarded 0 dead letters")
    assert _letters(r) == [unseen]
    r.xtrim(DLQ, maxlen=0, approximate=False)


def test_a_confirmations_count_is_of_the_letters_up_to_its_bound(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    """The confirmation read how many letters there were and the newest one in two round trips:
    a letter that died between them was under its bound ("all" up to it) but not in its count,
    and was replayed or discarded unannounced. Letters die here as fast as one client adds
    them, while the page is asked for again and again."""
    dlq = KEYS.dlq("paced", "default")
    stop = threading.Event()

    def die() -> None:
        with redis.Redis.from_url(console_stack.redis_url) as writer:
            while not stop.is_set():
                writer.xadd(dlq, {"id": "racing"})

    shown: list[tuple[int, str]] = []
    wanted = {"action": "discard", "partition": "paced:default"}
    try:
        with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=console_stack.base_url) as client:
            console_login(client, admin_key)
            dying = pool.submit(die)
            until(lambda: r.xlen(dlq) > 0)
            for _ in range(50):
                page = client.get("/console/dead-letters/confirm", params=wanted).text
                count = re.search(r"Discard (\d+) dead letter", page)
                upto = re.search(r'name="upto" value="([0-9-]+)"', page)
                assert count is not None and upto is not None, page
                shown.append((int(count[1]), upto[1]))
            stop.set()
            dying.result()
        ids = [stream_id(entry_id) for entry_id, _ in r.xrange(dlq)]
    finally:
        stop.set()
        r.delete(dlq)
    wrong = [(n, upto) for n, upto in shown if n != bisect.bisect(ids, stream_id(upto))]
    assert not wrong, f"{len(wrong)} of {len(shown)} counts were not of the letters up to upto"


def test_discarding_up_to_the_greatest_entry_id_discards_every_letter(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    """A discard bound by the greatest id an entry may have: the id after it, one past 64 bits,
    made Redis refuse the trim, a 500."""
    dlq = KEYS.dlq("paced", "default")
    for _ in range(2):
        r.xadd(dlq, {"id": "doomed"})
    greatest = f"{2**64 - 1}-{2**64 - 1}"
    try:
        with httpx.Client(base_url=console_stack.base_url) as client:
            console_login(client, admin_key)
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/console").text)
            assert csrf is not None
            form = {"partition": "paced:default", "upto": greatest, "csrf": csrf[1]}
            done = client.post("/console/dead-letters/discard", data=form)
        assert done.status_code == 200 and "Discarded 2 dead letters" in done.text, done.text
        assert r.xlen(dlq) == 0
    finally:
        r.delete(dlq)


def test_a_key_sees_only_the_models_it_may_use(console_stack: Stack, admin_key: str) -> None:
    """`GET /v1/models` hides the models a key may not use; the console showed every model's
    partitions, queue depths and rates to it, on its pages and in its live feed, and every
    worker, with its host and pid (a worker serving `paced` here)."""
    # `paced` as its own repository has it, loaded at once (the module's takes 3 s)
    quick = {"CONVEYOR_MODEL_REPOSITORY": str(FIXTURES / "paced_repository")}
    unseen = console_stack.consumer_name(
        console_stack.start_worker("paced", "paced-unseen", **quick)
    )
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        narrow = pool.submit(
            issue_key, console_stack.redis_url, "acme", "read", models=frozenset({"faulty"})
        ).result()
    try:
        with httpx.Client(base_url=console_stack.base_url, timeout=30) as client:
            assert console_login(client, narrow).status_code == 303
            until(lambda: unseen in _workers_page(console_stack, admin_key))
            page = client.get("/console").text
            assert 'data-partition="faulty:default"' in page
            assert "paced:default" not in page
            jobs = client.get("/console/jobs").text
            assert "<option>faulty</option>" in jobs and "<option>paced</option>" not in jobs
            workers = client.get("/console/workers").text
            assert unseen not in workers and "paced:default" not in workers
            with client.stream("GET", "/console/stream") as events:
                data = next(line for line in events.iter_lines() if line.startswith("data: "))
    finally:
        console_stack.stop_process("paced-unseen")
    summary = json.loads(data[6:])
    assert {p["model"] for p in summary["partitions"]} == {"faulty"}
    assert all("paced:default" not in w["models"] for w in summary["workers"]), summary
    assert unseen not in data


def test_console_requests_count_against_the_keys_rate_limit(console_stack: Stack) -> None:
    """A key limited to one request per burst on /v1 read up to 5,000 job hashes a request
    from /console/jobs, as often as it liked: the console never took from its bucket."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        slow = pool.submit(
            issue_key, console_stack.redis_url, "acme", "read", rate_per_s=0.001, burst=1
        ).result()
    with httpx.Client(base_url=console_stack.base_url, timeout=30) as client:
        assert console_login(client, slow).status_code == 303
        page = client.get("/console/jobs")
        assert page.status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None
        limited = client.get("/console/jobs")
        assert limited.status_code == 429, limited.text
        assert int(limited.headers["retry-after"]) > 0
        assert limited.json()["error"]["type"] == "rate_limited"
        assert client.get("/console/static/console.css").status_code == 200  # not charged
        # a user signs out though the key's bucket is empty (its clients busy elsewhere)
        signed_out = client.post("/console/logout", data={"csrf": csrf[1]})
        assert signed_out.status_code == 303, signed_out.text
        assert client.get("/console/jobs").headers.get("location") == "/console/login"


def test_an_admin_key_sees_and_acts_only_on_the_models_it_may_use(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    """An admin key allowed `faulty` only got 403 for `paced` on /v1; its console showed
    `paced` in the live feed, its dead letters (to replay or discard) and its routes, and
    listed, opened and downloaded every tenant's `paced` jobs and batches."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        narrow = pool.submit(
            issue_key, console_stack.redis_url, "ops", "admin", models=frozenset({"faulty"})
        ).result()
    dlq = KEYS.dlq("paced", "default")
    entry = RequestEntry(new_job_id("paced", "default"), {"inputs": {"n": "hidden"}}, 1.0)
    r.xadd(dlq, {"entry": "1-0", "reason": "test", "deliveries": 3, **entry.encode()})
    job = _submit(console_stack, admin_key, {"prompt": "another team's"}, model="paced")
    batch = _paced_batch(console_stack, admin_key)
    try:
        assert job in _listed(console_stack, admin_key, model="paced")  # there to be hidden
        with httpx.Client(base_url=console_stack.base_url, timeout=30) as full:
            console_login(full, admin_key)
            _feed_batches(full, batch)  # in the summary every viewer shares
        with httpx.Client(base_url=console_stack.base_url, timeout=30) as client:
            assert console_login(client, narrow).status_code == 303
            assert client.get(f"/console/jobs/{job}").status_code == 404
            with client.stream("GET", f"/console/jobs/{job}/tokens") as tokens:
                assert tokens.status_code == 404  # (it streamed the job's tokens)
            assert job not in client.get("/console/jobs").text
            assert job not in client.get("/console/jobs", params={"model": "paced"}).text
            assert batch not in client.get("/console/batches").text
            assert client.get(f"/console/batches/{batch}/output").status_code == 404
            letters = client.get("/console/dead-letters").text
            assert "<h2>faulty:default" in letters and "paced:default" not in letters
            confirm = "/console/dead-letters/confirm?action=discard&partition="
            assert client.get(confirm + "faulty:default").status_code == 200
            assert client.get(confirm + "paced:default").status_code == 404
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', letters)
            assert csrf is not None
            form = {"partition": "paced:default", "csrf": csrf[1]}
            assert client.post("/console/dead-letters/discard", data=form).status_code == 404
            routes = client.get("/console/routes").text
            assert 'data-model="faulty"' in routes and 'data-model="paced"' not in routes
            with client.stream("GET", "/console/stream") as events:
                data = next(line for line in events.iter_lines() if line.startswith("data: "))
        assert r.xlen(dlq) == 1
    finally:
        r.delete(dlq)
        auth = {"Authorization": f"Bearer {admin_key}"}  # no worker runs them: end them here
        httpx.delete(f"{console_stack.base_url}/v1/jobs/{job}", headers=auth)
        httpx.post(f"{console_stack.base_url}/v1/batches/{batch}/cancel", headers=auth)
    summary = json.loads(data[6:])
    assert {p["model"] for p in summary["partitions"]} == {"faulty"}
    assert batch not in {b["id"] for b in summary["batches"]}


def _paced_batch(stack: Stack, key: str) -> str:
    """A one-line batch of `paced` jobs, submitted with `key`."""
    response = httpx.post(
        f"{stack.base_url}/v1/batches",
        params={"model": "paced"},
        content=b'{"custom_id": "c0", "body": {"inputs": {"prompt": "theirs"}}}\n',
        headers={"Authorization": f"Bearer {key}", "content-type": "application/jsonl"},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _workers_page(stack: Stack, key: str) -> str:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        console_login(client, key)
        return client.get("/console/workers").text


def test_the_dead_letters_page_counts_every_letter(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    """It listed the oldest 200 and said "200 entries" of a partition holding more, whose
    "Replay all" then replayed them all."""
    dlq = KEYS.dlq("paced", "default")
    for i in range(205):
        entry = RequestEntry(new_job_id("paced", "default"), {"inputs": {"i": i}}, 1.0)
        r.xadd(dlq, {"entry": "1-0", "reason": "test", "deliveries": 3, **entry.encode()})
    try:
        with httpx.Client(base_url=console_stack.base_url) as client:
            console_login(client, admin_key)
            page = client.get("/console/dead-letters").text
        assert "205 entries, the oldest 200 shown" in page, page
    finally:
        r.delete(dlq)


def test_the_replay_confirmation_names_the_lane_a_letter_goes_back_to(
    console_stack: Stack, admin_key: str
) -> None:
    """It said every entry became a job on the online lane, though a Batch item's letter goes
    back to the bulk lane, and one past its deadline is not replayed."""
    with httpx.Client(base_url=console_stack.base_url) as client:
        console_login(client, admin_key)
        wanted = {"action": "replay", "partition": "faulty:default"}
        page = client.get("/console/dead-letters/confirm", params=wanted).text
    assert "new job on the lane it died in" in page and "the online lane" not in page, page
    assert "deadline has passed" in page


def test_failed_job_page_shows_its_error(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    job_id = _submit(console_stack, admin_key, {"action": "raise", "tag": "bad-7"})
    until(lambda: _status(r, job_id) == "failed")
    page.goto(f"{console_stack.base_url}/console/jobs?id={job_id}")
    assert "ValueError" in page.inner_text("#job-error")
    assert "bad-7" in page.inner_text("#job-error")
    assert page.inner_text("#job-status") == "failed"
    assert '"tag":"bad-7"' in page.inner_text("#job-inputs")  # kept: its entry is gone
    assert re.fullmatch(r"[0-9a-f]{32}", page.inner_text("#job-trace"))
    timeline = page.inner_text("ol.timeline")
    assert page.locator("ol.timeline li.done").count() == 4, timeline  # every step happened
    assert re.search(r"waited [\d.]+ ms", timeline) and re.search(r"engine [\d.]+ ms", timeline)
    assert re.search(r"batch of \d+", timeline) and re.search(r"total [\d.]+ ms", timeline)
    worker = r.hget(KEYS.job(job_id), "worker")
    (attempt,) = page.locator("#job-attempts tr.attempt").all_inner_texts()  # which worker did what
    assert worker in attempt and "failed" in attempt and "ValueError" in attempt
    _screenshot(page, "job.png")
    page.goto(f"{console_stack.base_url}/console/jobs?status=failed&model=faulty")
    listed = page.inner_text("#jobs")
    assert job_id in listed
    page.goto(f"{console_stack.base_url}/console/jobs?status=succeeded&model=faulty")
    assert job_id not in page.inner_text("#jobs")
    page.goto(f"{console_stack.base_url}/console/jobs?model=faulty&tenant=ops")  # the key's
    assert job_id in page.inner_text("#jobs")
    page.goto(f"{console_stack.base_url}/console/jobs?model=faulty&tenant=acme")
    assert job_id not in page.inner_text("#jobs")


def test_large_outputs_are_cut_with_their_size_shown(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    job_id = _submit(console_stack, admin_key, {"text": "x" * 10_000})
    until(lambda: _status(r, job_id) == "succeeded")
    page.goto(f"{console_stack.base_url}/console/jobs/{job_id}")
    size = re.search(r"Outputs (\d+) bytes, truncated", page.inner_text("main"))
    assert size is not None and int(size[1]) > 10_000
    assert len(page.inner_text("#job-outputs")) <= 4096


def test_hostile_input_renders_as_text(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    hostile = "<script>alert(1)</script>"
    job_id = _submit(console_stack, admin_key, {"text": hostile})
    until(lambda: _status(r, job_id) == "succeeded")
    page.goto(f"{console_stack.base_url}/console/jobs/{job_id}")
    assert hostile in page.inner_text("#job-outputs")
    assert page.locator("#job-outputs script").count() == 0
    page.wait_for_timeout(300)  # a script that ran would have opened its dialog by now
    assert page.dialogs == []


def test_llm_job_streams_its_tokens_while_its_worker_warms_serves_and_drains(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    """One tab on the workers page, one on an LLM job's page: the new worker shows `warming`
    then `serving`; the job's tokens arrive live; SIGTERM mid-job shows `draining` while the
    worker finishes the job, then the worker leaves the list."""
    workers = page.context.new_page()
    workers.goto(f"{console_stack.base_url}/console/workers")
    row = workers.locator("#workers tbody tr", has_text="paced:default")
    states: list[str] = []

    def state() -> str:
        shown = row.locator(".state").all_inner_texts()
        states.extend(s for s in shown if not states or states[-1] != s)
        return shown[0] if shown else ""

    console_stack.start_worker("paced", name="paced")
    until(lambda: state() == "serving", timeout=60)
    assert states == ["warming", "serving"], states
    body = {"prompt": "tokens arrive live"}
    job_id = _submit(console_stack, admin_key, body, model="paced", parameters={"max_tokens": 160})
    page.goto(f"{console_stack.base_url}/console/jobs/{job_id}")
    count = page.locator("#token-count")
    until(lambda: re.fullmatch(r"[1-9]\d? tokens", count.inner_text()))  # mid-stream, no end
    stopping = threading.Thread(target=console_stack.stop_process, args=("paced",))
    stopping.start()  # SIGTERM, then waits for the worker to exit
    until(lambda: state() == "draining")
    until(lambda: count.inner_text() == "160 tokens · succeeded (length)")
    assert page.inner_text("#job-tokens").startswith("tokens arrive live tokens arrive ")
    stopping.join()
    until(lambda: row.count() == 0)  # a clean exit leaves the list at once
    assert states == ["warming", "serving", "draining"], states
    assert _status(r, job_id) == "succeeded"
    workers.close()

    # every token event carries its id, and a reconnection resumes after the one it names
    # (the browser's EventSource sends Last-Event-ID; without ids the view showed it all twice)
    token_ids = _token_ids(console_stack, admin_key, job_id)
    assert len(token_ids) >= 6 and all(token_ids)
    assert _token_ids(console_stack, admin_key, job_id, token_ids[4]) == token_ids[5:]


def _token_ids(stack: Stack, key: str, job_id: str, last_event_id: str = "") -> list[str]:
    """The ids of the token events the console's token view sends, until its `final`."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    ids: list[str] = []
    event, event_id = "", ""
    with httpx.Client(base_url=stack.base_url, timeout=30) as viewer:
        assert console_login(viewer, key).status_code == 303
        url = f"/console/jobs/{job_id}/tokens"
        with viewer.stream("GET", url, headers=headers) as events:
            for line in events.iter_lines():
                name, _, value = line.partition(": ")
                if name == "event":
                    event = value
                elif name == "id":
                    event_id = value
                elif not line and event == "final":
                    return ids
                elif not line:
                    if event == "token":
                        ids.append(event_id)
                    event, event_id = "", ""
    return ids


def test_workers_page_lists_the_live_worker(console_stack: Stack, page: Any) -> None:
    """`fixed`, the queue test's last worker, alone: the two that crashed there leave the list
    as their heartbeats expire (TTL_S, 10 s), which the tests between have outlasted."""
    page.goto(f"{console_stack.base_url}/console/workers")
    row = page.locator("#workers tbody tr", has_text="faulty:default")
    until(lambda: row.count() == 1 and "serving" in row.inner_text())
    assert "FaultEngine" in row.inner_text()
    _screenshot(page, "workers.png")
    # the session is out of the page's reach: no script-visible cookie, storage or URL holds it
    assert page.evaluate("document.cookie") == ""  # HttpOnly
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0
    assert "key" not in page.url


def test_batch_progress_reaches_100_percent(
    console_stack: Stack, admin_key: str, page: Any
) -> None:
    # two micro-batches of a second each: the batch runs long enough to be seen running
    line = '{{"custom_id": "c{0}", "body": {{"inputs": {{"n": {0}, "sleep_ms": 1000}}}}}}\n'
    lines = "".join(line.format(n) for n in range(64))
    response = httpx.post(
        f"{console_stack.base_url}/v1/batches",
        params={"model": "faulty"},
        content=lines.encode(),
        headers={"Authorization": f"Bearer {admin_key}", "content-type": "application/jsonl"},
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["id"]
    page.goto(f"{console_stack.base_url}/console/batches")
    row = page.locator(f'tr[data-batch="{batch_id}"]')
    until(lambda: row.count() == 1 and "100%" in row.inner_text(), timeout=60)
    assert "completed" in row.inner_text()
    _screenshot(page, "batches.png")
    with page.expect_download() as download:
        row.locator("a", has_text="output").click()
    results = Path(download.value.path()).read_text().splitlines()
    ids = sorted(json.loads(result)["custom_id"] for result in results)
    assert ids == sorted(f"c{n}" for n in range(64))


def test_tenant_cannot_open_another_tenants_job(
    console_stack: Stack, admin_key: str, browser: Any, r: redis.Redis
) -> None:
    job_id = _submit(console_stack, admin_key, {"n": "private"})
    # Playwright's sync API keeps an event loop on this thread; issue_key needs its own
    with ThreadPoolExecutor(1) as pool:
        tenant_key = pool.submit(issue_key, console_stack.redis_url, "acme", "read").result()
    with httpx.Client(base_url=console_stack.base_url) as client:
        assert console_login(client, tenant_key).status_code == 303
        assert client.get(f"/console/jobs/{job_id}").status_code == 404
        assert job_id not in client.get("/console/jobs", params={"tenant": "ops"}).text
        assert client.get("/console/dead-letters").status_code == 403
        assert client.get("/console/routes").status_code == 403


def _feed_batches(client: httpx.Client, wanted: str, summaries: int = 20) -> set[tuple[str, str]]:
    """(batch id, tenant) of every batch the live feed showed, up to the first summary that
    shows `wanted` (one summary a second; at most `summaries` of them)."""
    seen: set[tuple[str, str]] = set()
    with client.stream("GET", "/console/stream", timeout=30) as events:
        for line in events.iter_lines():
            if line.startswith("data: "):
                seen |= {(b["id"], b["tenant"]) for b in json.loads(line[6:])["batches"]}
                summaries -= 1
                if any(batch_id == wanted for batch_id, _ in seen) or summaries == 0:
                    break
    assert any(batch_id == wanted for batch_id, _ in seen), f"no batch {wanted} in the feed"
    return seen


def test_a_tenant_sees_only_its_own_batches_live_and_logs_out(
    console_stack: Stack, admin_key: str
) -> None:
    """The live feed cuts batches to the viewer's tenant (an admin sees all); logging out ends
    the session, so the console sends the browser back to its login, and so it does anyone who
    presents a copy of the session's cookie."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        acme_key = pool.submit(issue_key, console_stack.redis_url, "acme", "submit", "read")
        acme = acme_key.result()

    def batch(key: str) -> str:
        response = httpx.post(
            f"{console_stack.base_url}/v1/batches",
            params={"model": "faulty"},
            # running for seconds, so that the feed's once-a-second look finds it running
            content=b'{"custom_id": "c0", "body": {"inputs": {"n": 0, "sleep_ms": 3000}}}\n',
            headers={"Authorization": f"Bearer {key}", "content-type": "application/jsonl"},
        )
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    ours, theirs = batch(acme), batch(admin_key)
    with httpx.Client(base_url=console_stack.base_url) as admin:
        console_login(admin, admin_key)
        assert (ours, "acme") in _feed_batches(admin, ours)
        assert (theirs, "ops") in _feed_batches(admin, theirs)
        # the admin downloads another tenant's batch file (it answered 404); the batch is
        # cancelled, unless a worker finished it first
        acme_calls = {"Authorization": f"Bearer {acme}"}
        batch_url = f"{console_stack.base_url}/v1/batches/{ours}"
        cancelled = httpx.post(f"{batch_url}/cancel", headers=acme_calls)
        assert cancelled.status_code in (200, 409), cancelled.text
        ended = until(
            lambda: (
                {"completed", "cancelled"}
                & {httpx.get(batch_url, headers=acme_calls).json()["status"]}
            )
        )
        kind = "output" if ended == {"completed"} else "errors"
        shown = admin.get(f"/console/batches/{ours}/{kind}")
        assert shown.status_code == 200 and '"custom_id":"c0"' in shown.text, shown.text
    with httpx.Client(base_url=console_stack.base_url) as client:
        assert console_login(client, acme).status_code == 303
        seen = _feed_batches(client, ours)
        assert (ours, "acme") in seen and {tenant for _, tenant in seen} == {"acme"}
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/console").text)
        assert csrf is not None
        copied = client.cookies.get("conveyor_console")  # a copy of the session cookie
        out = client.post("/console/logout", data={"csrf": csrf[1]})
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
        assert client.get("/console").status_code == 303
    with httpx.Client(base_url=console_stack.base_url) as thief:
        # the logout ended the session itself, not just the browser's cookie
        thief.cookies.set("conveyor_console", copied, path="/console")
        assert thief.get("/console").status_code == 303


def test_a_live_feed_ends_when_its_session_is_logged_out_elsewhere(
    console_stack: Stack, admin_key: str
) -> None:
    """The session was checked once, when the feed opened: a summary a second (partitions,
    workers, the tenant's batches) went on for as long as the connection stayed open, after a
    logout from another tab or replica, a revocation, or the session's expiry."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        key = pool.submit(issue_key, console_stack.redis_url, "acme", "read").result()
    summaries: list[float] = []
    ended: list[float] = []
    with httpx.Client(base_url=console_stack.base_url, timeout=30) as viewer:
        assert console_login(viewer, key).status_code == 303
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', viewer.get("/console").text)
        assert csrf is not None

        def watch() -> None:
            with viewer.stream("GET", "/console/stream") as events:
                for line in events.iter_lines():
                    if line.startswith("event: summary"):
                        summaries.append(time.monotonic())
            ended.append(time.monotonic())

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        until(lambda: len(summaries) >= 2)
        with httpx.Client(base_url=console_stack.base_url) as other_tab:
            other_tab.cookies.set(
                "conveyor_console", viewer.cookies["conveyor_console"], "", "/console"
            )
            out = other_tab.post("/console/logout", data={"csrf": csrf[1]})
            assert out.status_code == 303, out.text
        logged_out = time.monotonic()
        watching.join(timeout=RECHECK_S + 10)
    assert ended, "the feed went on after its session was logged out"
    assert summaries[-1] - logged_out < RECHECK_S + 2


def test_a_batch_that_ran_between_two_looks_of_the_feed_is_shown(
    console_stack: Stack, admin_key: str
) -> None:
    """The feed looks at running batches once a second; one that ran and ended in between (the
    sweeper or a reader finalized it) is shown from the ended index."""
    if "fixed" not in console_stack.processes:  # run alone: the module's worker for `faulty`
        console_stack.start_worker("faulty", name="fixed", **{FIXED_ENV: "1"})
    auth = {"Authorization": f"Bearer {admin_key}"}
    response = httpx.post(
        f"{console_stack.base_url}/v1/batches",
        params={"model": "faulty"},
        content=b'{"custom_id": "c0", "body": {"inputs": {"n": 0}}}\n',
        headers={**auth, "content-type": "application/jsonl"},
    )
    assert response.status_code == 202, response.text
    url = f"{console_stack.base_url}/v1/batches/{response.json()['id']}"
    until(lambda: httpx.get(url, headers=auth).json()["status"] == "completed", timeout=60)
    with httpx.Client(base_url=console_stack.base_url) as admin:
        console_login(admin, admin_key)
        assert (response.json()["id"], "ops") in _feed_batches(admin, response.json()["id"])


def test_error_responses_carry_the_security_headers(console_stack: Stack, admin_key: str) -> None:
    """Only pages carried the Content-Security-Policy: the app's exception handlers made the
    redirect to the login page and every 403, 404 and 422 without it."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        reader = pool.submit(issue_key, console_stack.redis_url, "acme", "read").result()
    with httpx.Client(base_url=console_stack.base_url) as client:
        answers = [client.get("/console/dead-letters")]  # no session: to the login page
        console_login(client, reader)
        answers += [
            client.get("/console/dead-letters"),  # an admin's page
            client.get(f"/console/jobs/{new_job_id('faulty', 'default')}"),
        ]
    with httpx.Client(base_url=console_stack.base_url) as client:
        console_login(client, admin_key)
        answers.append(client.get("/console/dead-letters/confirm"))  # no action, no partition
    assert [answer.status_code for answer in answers] == [303, 403, 404, 422]
    for answer in answers:
        assert "script-src 'self'" in answer.headers.get("content-security-policy", ""), (
            answer.status_code,
            dict(answer.headers),
        )
        assert answer.headers["x-frame-options"] == "DENY"


def test_post_without_csrf_token_is_refused(console_stack: Stack, admin_key: str) -> None:
    with httpx.Client(base_url=console_stack.base_url) as client:
        without = client.post("/console/login", data={"key": admin_key})
        assert without.status_code == 403  # no login CSRF either
        login = console_login(client, admin_key)
        assert login.status_code == 303 and admin_key not in login.headers["location"]
        (session,) = [c for c in login.headers.get_list("set-cookie") if "_console=" in c]
        attributes = {part.strip().lower() for part in session.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/console"} <= attributes, session
        assert admin_key not in session  # the cookie holds the key's public id, signed
        form = {"partition": "faulty:default"}
        assert client.post("/console/dead-letters/discard", data=form).status_code == 403
        forged = {**form, "csrf": "0" * 64}
        assert client.post("/console/dead-letters/discard", data=forged).status_code == 403


def test_what_the_console_does_not_have_is_404_and_changes_nothing(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    _dead_letter(r, {"n": "kept"})
    letters = r.xlen(DLQ)
    with httpx.Client(base_url=console_stack.base_url) as client:
        console_login(client, admin_key)
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/console").text)
        assert csrf is not None
        missing = [
            client.get("/console/static/..%2F..%2Fconfig.yaml"),
            client.get("/console/static/console.exe"),
            client.get(f"/console/jobs/{new_job_id('faulty', 'default')}"),
            client.get(f"/console/jobs/{'x' * 200}"),
            client.get(f"/console/batches/batch_{'0' * 32}/output"),
            client.get(f"/console/batches/batch_{'0' * 32}/secrets"),
            client.get("/console/dead-letters/confirm?action=explode&partition=faulty:default"),
            client.get("/console/dead-letters/confirm?action=discard&partition=nope:default"),
            client.get(  # a letter that is not there (the page used to ask to replay "1")
                "/console/dead-letters/confirm?action=replay&partition=faulty:default&entry=1-1"
            ),
            client.post(
                "/console/dead-letters/explode",
                data={"partition": "faulty:default", "csrf": csrf[1]},
            ),
            client.post(
                "/console/dead-letters/discard", data={"partition": "faulty:v9", "csrf": csrf[1]}
            ),
        ]
    assert [response.status_code for response in missing] == [404] * len(missing), [
        (str(response.url), response.text[:200]) for response in missing
    ]
    assert r.xlen(DLQ) == letters


def _commands(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(value["calls"]) for value in stats.values())


def _calls_during(r: redis.Redis, seconds: float) -> int:
    start = _commands(r)
    time.sleep(seconds)  # a measuring window, not a wait for a condition
    return _commands(r) - start


def test_ten_viewers_cost_redis_what_one_does(
    console_stack: Stack, admin_key: str, r: redis.Redis
) -> None:
    """Every viewer reads the same in-memory summary: 10 streams add (almost) no commands."""
    fixed = console_stack.consumer_name(console_stack.processes["fixed"].pid)
    assert r.hget(KEYS.worker(fixed), "state") == '"serving"'
    console_stack.stop_process("fixed")  # a worker's own polling would only add noise
    assert not r.exists(KEYS.worker(fixed))  # a clean exit leaves the list at once

    def viewers(count: int) -> int:
        stop = threading.Event()
        received = [0] * count

        def view(index: int) -> None:
            with httpx.Client(base_url=console_stack.base_url, timeout=30) as client:
                console_login(client, admin_key)
                with client.stream("GET", "/console/stream") as events:
                    for line in events.iter_lines():
                        received[index] += line.startswith("event: summary")
                        if stop.is_set():
                            return

        threads = [threading.Thread(target=view, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        until(lambda: all(n >= 2 for n in received))
        calls = _calls_during(r, 2.0)
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        return calls

    one = viewers(1)
    ten = viewers(10)
    # 90: ten feeds' rechecks (RECHECK_S) at most, each the session's two commands and its
    # place's renewal among the key's streams (a script of seven)
    assert ten < one * 1.5 + 90, (one, ten)


def test_a_deep_queued_jobs_page_shows_its_inputs(
    console_stack: Stack, admin_key: str, page: Any, r: redis.Redis
) -> None:
    """A job queued behind 2,100 others, with no worker for its partition (`paced` has none
    here): its page read its partition's lanes oldest first, 2,000 entries of each, and showed
    no inputs; then from the job's creation less the clock-skew margin, 2,000 entries, which a
    burst of 2,100 jobs in the seconds before it (a Batch API batch) filled. It reads on."""
    assert not {"paced", "paced-unseen"} & set(console_stack.processes)
    lane = KEYS.queue("paced", "default")
    with r.pipeline(transaction=False) as pipe:
        for n in range(ENTRY_SCAN + 100):
            ahead = RequestEntry(new_job_id("paced", "default"), {"prompt": f"ahead-{n}"}, 1.0)
            pipe.xadd(lane, ahead.encode())  # type: ignore[arg-type]
        ahead_ids = pipe.execute()
    job_id = _submit(console_stack, admin_key, {"prompt": "deep-queued"}, model="paced")
    try:
        page.goto(f"{console_stack.base_url}/console/jobs/{job_id}")
        assert page.inner_text("#job-status") == "queued"
        assert page.locator("#job-inputs").count() == 1, page.inner_text("main")
        assert "deep-queued" in page.inner_text("#job-inputs")
    finally:
        httpx.delete(
            f"{console_stack.base_url}/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {admin_key}"},
        )
        r.xdel(lane, *ahead_ids)


def test_a_page_opens_a_new_feed_once_the_browser_gave_its_own_up(
    console_stack: Stack, page: Any
) -> None:
    """EventSource gives up for good on an answer that is not a stream (a 503 while the producer
    cannot reach Redis, a proxy's 502 while it restarts): the page's figures stopped until it
    was reloaded. Its first stream is refused here; the page opens another."""
    opened: list[str] = []

    def refuse_the_first(route: Any) -> None:
        opened.append(route.request.url)
        if len(opened) == 1:
            route.fulfill(status=503, body="unavailable")
        else:
            route.continue_()

    page.route("**/console/stream", refuse_the_first)
    try:
        page.goto(f"{console_stack.base_url}/console")
        until(lambda: page.locator("body").get_attribute("data-updated"), timeout=15)
    finally:
        page.unroute("**/console/stream", refuse_the_first)
    assert len(opened) >= 2, opened


def test_a_live_feed_outlasts_a_redis_outage(console_stack: Stack, admin_key: str) -> None:
    """A Redis that did not answer a feed's look at its session (every RECHECK_S) cut the feed;
    the browser's reconnect met a 503 (no session without Redis) and EventSource gave up:
    every open page stopped for good. The same feed goes on once Redis answers again."""
    summaries: list[float] = []
    stop = threading.Event()
    with httpx.Client(base_url=console_stack.base_url, timeout=30) as viewer:
        assert console_login(viewer, admin_key).status_code == 303

        def watch() -> None:
            with viewer.stream("GET", "/console/stream") as events:
                for line in events.iter_lines():
                    if line.startswith("event: summary"):
                        summaries.append(time.monotonic())
                    if stop.is_set():
                        return

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        until(lambda: summaries)
        with frozen(console_stack):
            time.sleep(RECHECK_S + 5)  # an outage that a look at the session falls in
        thawed = time.monotonic()
        try:
            until(lambda: summaries[-1] > thawed, timeout=10)
        finally:
            stop.set()
            watching.join(timeout=10)


def _classes(node: Any) -> set[str]:
    return set((node.get_attribute("class") or "").split())


def test_the_live_dot_goes_stale_while_no_summary_comes(console_stack: Stack, page: Any) -> None:
    """Redis frozen, the producer publishes no summary while the page's stream stays open: the
    dot stayed green over figures that no longer moved. It turns `stale` once none came for
    3 s, and back on with the next one. Last: the whole stack's Redis stops a while."""
    page.goto(f"{console_stack.base_url}/console")
    live = page.locator("#live")
    until(lambda: "on" in _classes(live))
    with frozen(console_stack):
        until(lambda: _classes(live) & {"on", "stale"} == {"stale"}, timeout=20)
    until(lambda: _classes(live) & {"on", "stale"} == {"on"}, timeout=60)
