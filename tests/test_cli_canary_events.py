"""`conveyor canary status --events N` against a small real HTTP server that answers the canary
route as the producer does: `events` decisions (1 to 500; 100 unless asked), the latest last.
The CLI never asked, so it showed at most 100 whatever N was."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from click.testing import CliRunner

from conveyor.cli import main
from tests.local_http import LocalServer, QuietHandler, serving

DECISIONS = 300  # held by the canary: more than the route's default answer
CANARY = {"model": "ab", "variant": "candidate", "baseline": "stable", "state": "running"}


class _Producer(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        asked = parse_qs(urlsplit(self.path).query).get("events", ["100"])
        count = min(int(asked[0]), DECISIONS)
        decisions = [
            {"type": "step", "weight": 10.0, "at": 1_700_000_000 + i, "reason": f"look {i}"}
            for i in range(DECISIONS - count, DECISIONS)
        ]
        view = {"canary": {**CANARY, "weight": 10.0, "steps": [10.0, 100.0]}, "events": decisions}
        self.answer(200, orjson.dumps(view), {"Content-Type": "application/json"})


@pytest.mark.parametrize("events", [0, 1, 250])
def test_status_shows_as_many_decisions_as_asked(events: int) -> None:
    with serving(LocalServer(_Producer)) as server:
        args = ["canary", "status", "ab", "--events", str(events), "--url", server.url]
        shown = CliRunner().invoke(main, args)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == "ab:candidate vs stable: running, 10 % (steps 10,100)"
    looks = [line.rsplit("(", 1)[1].rstrip(")") for line in lines[1:]]
    assert looks == [f"look {i}" for i in range(DECISIONS - events, DECISIONS)]


def test_status_refuses_more_decisions_than_the_producer_keeps() -> None:
    refused = CliRunner().invoke(main, ["canary", "status", "ab", "--events", "501"])
    assert refused.exit_code == 2 and "0<=x<=500" in refused.output, refused.output
