"""The jobs resource at its edges, through the real producer and Valkey: what a client sends
that a lax reading would guess at is refused (422) instead, and an id not shaped as one whole is
unknown (404) before it reaches a Redis key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from producer_api.errors import ConveyorError
from producer_api.jobs.serving import checked_id

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("field", "value"),
    [("ttl_s", True), ("ttl_s", "5"), ("deadline", "4102444800"), ("deadline", True)],
)
def test_a_time_limit_that_is_not_a_json_number_is_422(
    base_url: str, field: str, value: Any
) -> None:
    """`"ttl_s": true` was a job that expired a second after it was accepted, and `"5"` was
    read as 5, while the sampling parameters beside them refuse both."""
    body = {"model": "identity", "inputs": {}, field: value}
    for path in ("/v1/jobs", "/v1/models/identity/predict"):
        sent = body if path == "/v1/jobs" else {k: v for k, v in body.items() if k != "model"}
        response = httpx.post(f"{base_url}{path}", json=sent, timeout=30)
        assert response.status_code == 422, (path, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request" and error["message"].startswith(f"{field}: ")


def test_an_id_with_a_trailing_newline_is_unknown() -> None:
    """`GET /v1/jobs/{id}%0A` read the Redis key `cv:job:{tag}…\\n`: the id check let a
    trailing newline through, though no client text reaches a key unchecked (README)."""
    job_id = "eaac" + "0" * 28
    assert checked_id(job_id) == job_id
    with pytest.raises(ConveyorError) as refused:
        checked_id(job_id + "\n")
    assert refused.value.status == 404
