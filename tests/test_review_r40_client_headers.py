"""A request the SDK cannot send for a header past ASCII (an Idempotency-Key `clé`) says so: it
was reported as its JSON body's "lone surrogate", a body that was fine."""

from __future__ import annotations

import pytest

from conveyor.client.errors import InvalidArgument
from conveyor.client.sync_client import Client

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request sent would fail otherwise


@pytest.mark.parametrize("key", ["clé", "ключ-中"], ids=["latin", "cyrillic-cjk"])
def test_a_non_ascii_idempotency_key_is_refused_as_a_header_not_as_the_body(key: str) -> None:
    with Client(NOWHERE, "cvk_unused") as client, pytest.raises(InvalidArgument) as refused:
        client.submit("identity", {"text": "fine"}, idempotency_key=key)

    said = str(refused.value)
    assert said.startswith("a header cannot be sent: it holds "), said
    assert "JSON body" not in said and "surrogate" not in said, said


def test_a_non_ascii_last_event_id_is_refused_as_a_header_on_a_call_without_a_body() -> None:
    """A GET carries no JSON: its header past ASCII was httpx's UnicodeEncodeError traceback."""
    with Client(NOWHERE, "cvk_unused") as client, pytest.raises(InvalidArgument) as refused:
        next(iter(client.stream("job-1", last_event_id="événement")))

    assert str(refused.value) == "a header cannot be sent: it holds 'é', not ASCII"
