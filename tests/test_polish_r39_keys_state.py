"""`conveyor keys list` says each key's state as a token (`active`, `revoked`, `expired`), in its
table and its `--json`: it said the auth refusal's message (`API key revoked`), no state a
script could match on. On a real Valkey."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from click.testing import Result

from shared.api_keys import key_id_of
from tests.conftest import issue_key
from tests.test_keys_r21_rotate import keys_cli

__all__ = ["keys_cli"]  # the fixture, used here by name


def test_list_states_are_tokens(keys_cli: Callable[..., Result], redis_url: str) -> None:
    live = key_id_of(issue_key(redis_url, "acme", "read", name="live"))
    gone = key_id_of(issue_key(redis_url, "acme", "read", name="old", expires_at=time.time() - 60))
    cut = key_id_of(issue_key(redis_url, "acme", "read", name="cut"))
    assert keys_cli("revoke", cut).exit_code == 0

    table, as_json = keys_cli("list"), keys_cli("list", "--json")

    assert table.exit_code == 0 and as_json.exit_code == 0, (table.output, as_json.output)
    expected = {live: "active", gone: "expired", cut: "revoked"}
    columns = [line.split("\t") for line in table.stdout.splitlines()]
    assert {row[0]: row[4] for row in columns} == expected, table.stdout
    states = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert {state["key_id"]: state["state"] for state in states} == expected, as_json.stdout
