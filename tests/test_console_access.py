"""The console as a browser shows it to whoever holds it: a read-only key is offered only the
pages it may open, a login form left open past its pre-login cookie's life still logs in, and a
page whose session ended elsewhere goes to the login page."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conveyor.stack import Stack
from tests.conftest import issue_key
from tests.test_console import browser, pytestmark  # noqa: F401

ADMIN_PAGES = ("/console/dead-letters", "/console/routes")


@pytest.fixture(scope="module")
def console_stack(auth_stack: Stack) -> Stack:
    """The session's pipeline with API keys enforced: these pages need no model of their own
    (test_console.py's stack, with its models and workers, would be a second one to start)."""
    return auth_stack


@pytest.fixture(scope="module")
def admin_key(console_stack: Stack) -> str:
    return issue_key(console_stack.redis_url, "ops", "admin")


@pytest.fixture
def tab(browser: Any) -> Iterator[Any]:  # noqa: F811
    context = browser.new_context()
    yield context.new_page()
    context.close()


def _log_in(tab: Any, stack: Stack, key: str) -> None:
    tab.goto(f"{stack.base_url}/console/login")
    tab.fill("#key", key)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{stack.base_url}/console")


def _nav(tab: Any) -> list[str]:
    return [str(link.get_attribute("href")) for link in tab.locator("header nav a").all()]


def test_a_read_only_key_is_not_offered_the_admin_pages(
    console_stack: Stack,
    admin_key: str,
    tab: Any,
) -> None:
    """The nav linked every key to Dead letters and Routes, which answer a read key a JSON 403."""
    with ThreadPoolExecutor(1) as pool:  # issue_key runs its own event loop
        reader = pool.submit(issue_key, console_stack.redis_url, "acme", "read").result()
    _log_in(tab, console_stack, reader)
    shown = _nav(tab)
    assert "/console/jobs" in shown and not set(ADMIN_PAGES) & set(shown), shown
    tab.context.clear_cookies()
    _log_in(tab, console_stack, admin_key)
    assert set(ADMIN_PAGES) <= set(_nav(tab))


def test_a_lapsed_login_form_shows_itself_again_and_logs_in(
    console_stack: Stack,
    admin_key: str,
    tab: Any,
) -> None:
    """The pre-login cookie lasts 10 minutes: a form submitted after it lapsed (the browser
    dropped it) answered a bare JSON 403, not the form with why."""
    tab.goto(f"{console_stack.base_url}/console/login")
    tab.context.clear_cookies()  # as the browser does once the cookie's max-age has passed
    tab.fill("#key", admin_key)
    tab.click("button[type=submit]")
    assert "lapsed" in tab.inner_text("[role=alert]")
    tab.fill("#key", admin_key)  # the form it showed carries a fresh cookie and token
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{console_stack.base_url}/console")


def test_a_page_whose_session_ended_elsewhere_goes_to_the_login_page(
    console_stack: Stack,
    admin_key: str,
    tab: Any,
) -> None:
    """Its feed ends with the session and the reconnect is sent to the login page, which
    EventSource takes for a failure: the page retried for good, its figures stale, its
    viewer never told to log in again."""
    _log_in(tab, console_stack, admin_key)
    other = tab.context.new_page()  # the same session, in a second tab
    other.goto(f"{console_stack.base_url}/console/workers")
    other.click("header form button")  # Log out
    other.wait_for_url(f"{console_stack.base_url}/console/login")
    tab.wait_for_url(f"{console_stack.base_url}/console/login", timeout=30_000)
