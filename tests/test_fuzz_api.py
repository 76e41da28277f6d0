"""Property-based fuzzing of the whole OpenAPI surface with schemathesis, against a real
producer (auth on, a real Valkey): valid and invalid requests alike must never get a 5xx, and
every response must match what the OpenAPI promises (status code, content type, headers and
body schema). Bounded by examples per operation so it ends in a minute or two on two cores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from tests.conftest import issue_key

pytestmark = pytest.mark.slow
EXAMPLES = 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_url(auth_stack: Stack) -> Iterator[str]:
    """A producer of its own whose long-polls end at once: fuzzed `wait` and `timeout`
    values would otherwise hold each request for up to a minute on jobs no worker serves."""
    url = auth_stack.start_producer(free_port(), name="fuzz-producer", CONVEYOR_MAX_WAIT_S="0.05")
    try:
        yield url
    finally:
        auth_stack.stop_process("fuzz-producer")


@pytest.fixture(scope="module")
def fuzz_key(auth_stack: Stack) -> str:
    limits = {"rate_per_s": 1e6, "burst": 10**6, "max_in_flight": 10**6}
    return issue_key(auth_stack.redis_url, "fuzz", "submit", "read", **limits)


# The OpenAPI the producer serves, taken from the app itself at collection time (so each
# operation is its own test); the requests go over HTTP to the real producer below.
schema = schemathesis.openapi.from_dict(create_app().openapi())
# The key goes in X-API-Key; generated Authorization headers would only ever meet 401.
schema.config.generation.update(with_security_parameters=False)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_response_matches_the_schema(
    case: schemathesis.Case, fuzz_url: str, fuzz_key: str
) -> None:
    case.call_and_validate(base_url=fuzz_url, headers={"X-API-Key": fuzz_key}, checks=CHECKS)
