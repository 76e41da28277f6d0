"""The test suite's producer is the deployments' producer: `Stack.start_producer` (hence the
`stack`, `auth_stack` and `running_stack` producers) ran uvicorn's own command line, while
compose, Kubernetes, the image and `conveyor up` run conveyor/producer_server.py, so no stack
test exercised what ships (its head bound, its socket, its logging)."""

from __future__ import annotations

from conveyor.producer_server import HEAD_MAX_BYTES
from tests.test_bad_input_audit_headers import _answers, _head


def test_the_stacks_producer_refuses_a_head_past_the_deployments_bound(base_url: str) -> None:
    """Only the deployments' server bounds a request's head (uvicorn's takes any size)."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)

    answer = _answers((host, int(port)), _head(HEAD_MAX_BYTES + 1024, end=b""), b"\r\n\r\n")

    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
