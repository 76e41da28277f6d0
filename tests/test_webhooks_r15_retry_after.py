"""A receiver's Retry-After given as an HTTP date with no zone of its own (asctime's form, or
RFC 5322's `-0000`), on a worker whose clock runs in a zone other than GMT: every HTTP date is
GMT, so the next attempt waits what was asked (read as local time, a worker nine hours east of
GMT took a date 90 s ahead for one long past and came back at once, refused again)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from email.utils import formatdate

import pytest

from tests.test_webhook_timeouts import EVENT, _answering
from workers.webhook_delivery import _post


@pytest.fixture
def nine_hours_east(settings_env: Callable[..., None]) -> Iterator[None]:
    """The worker's local time is GMT+9 (a POSIX zone rule: no zone database needed)."""
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="1", CONVEYOR_WEBHOOK_SECRET="whsec-test")
    before = os.environ.get("TZ")
    os.environ["TZ"] = "JST-9"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize(
    "when", [lambda t: time.asctime(time.gmtime(t)), lambda t: formatdate(t, usegmt=False)]
)
def test_a_retry_after_date_with_no_zone_is_read_as_gmt(
    nine_hours_east: None, when: Callable[[float], str]
) -> None:
    dated_at = time.time()
    url = _answering("503 Service Unavailable", f"Retry-After: {when(dated_at + 90)}\r\n")
    outcome = _post(url, b"{}", EVENT)
    # what is left of the 90 s when the answer is read: a date counts whole seconds, and the
    # time since it was written (seconds on a loaded machine) is gone from it
    since_s = time.time() - dated_at
    assert outcome["error"] == "HTTP 503"
    assert 89 - since_s <= outcome["retry_after_s"] <= 90, (outcome, since_s)
