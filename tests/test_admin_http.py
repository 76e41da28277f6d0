"""The traffic commands' admin call (`conveyor routes`, `conveyor canary`) against a real HTTP
server standing where the producer should: every answer that is not the producer's success is
one readable line, a redirect included (its empty body was returned as the answer, None, and
`routes set` failed on it with a TypeError traceback)."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest

from conveyor.client.admin_http import admin_call
from tests.local_http import LocalServer, QuietHandler, serving

MOVED_TO = "https://conveyor.example/v1/models/identity/routes"


class _Handler(QuietHandler):
    """A 308 for `/moved`, a proxy's HTML 502 for `/down`."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/moved"):
            status, extra, body = 308, {"Location": MOVED_TO}, b""
        else:
            status, extra, body = 502, {"Content-Type": "text/html"}, b"<h1>Bad Gateway</h1>"
        self.answer(status, body, extra)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    with serving(LocalServer(_Handler)) as running:
        yield running


@pytest.mark.parametrize(
    ("path", "said"), [("/moved", f"308 redirect: redirected to {MOVED_TO}"), ("/down", "502")]
)
def test_an_answer_that_is_not_a_success_is_one_line(
    server: LocalServer, path: str, said: str
) -> None:
    with pytest.raises(click.ClickException) as refused:
        admin_call("GET", path, server.url, None)
    assert said in refused.value.message
    assert "\n" not in refused.value.message
