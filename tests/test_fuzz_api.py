"""Property-based fuzzing of the whole OpenAPI surface with schemathesis, against a real
producer (auth on, a real Valkey): valid and invalid requests alike must never get a 5xx, and
every response must match what the OpenAPI promises (status code, content type, headers and
body schema). Bounded by examples per operation so it ends in a minute or two on two cores.
The operations on a model run twice: with generated model names, which rarely name one, and
with the served identity model's, so their success paths (and a predict that expires in the
queue) meet the same checks.
Hostile values (lone surrogates, integers beyond 64 bits, non-finite numbers, deep nesting)
planted anywhere in otherwise valid bodies must get a 413 or 422 (400 on OpenAI's routes, as
OpenAI's API answers) that passes the same checks."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, cast

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conveyor.stack import Stack, free_port
from producer_api.app import create_app
from producer_api.openai import OPENAI_PATHS
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
OPENAPI = create_app().openapi()


def _loaded() -> Any:
    """The OpenAPI as schemathesis tests it. The key goes in X-API-Key; generated
    Authorization headers would only ever meet 401."""
    loaded = schemathesis.openapi.from_dict(OPENAPI)
    loaded.config.generation.update(with_security_parameters=False)
    return loaded


schema = _loaded()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_every_response_matches_the_schema(
    case: schemathesis.Case, fuzz_url: str, fuzz_key: str
) -> None:
    case.call_and_validate(base_url=fuzz_url, headers={"X-API-Key": fuzz_key}, checks=CHECKS)


# The same operations on a model a worker serves: predicts that run and end, its experiments,
# and its routes and canary (403: the key has no `admin` scope, and other tests share the
# stack). Only a fuzzed `deadline` shorter than the queue's hand-off gets a 5xx, the 504 an
# expired job ends a predict with (documented; checked for conformance like any other answer).
served = _loaded().include(path_regex=r"\{model\}")
served.config.update(parameters={"path.model": "identity"})


def not_a_server_error_but_an_expired_job(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    if response.status_code == 504 and response.json()["error"]["type"] == "DeadlineExceeded":
        return None
    return not_a_server_error(ctx, response, case)


@pytest.fixture(scope="module")
def identity_served(auth_stack: Stack) -> Iterator[None]:
    auth_stack.start_worker("identity:default", name="fuzz-worker")
    try:
        yield
    finally:
        auth_stack.stop_process("fuzz-worker")


@served.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_a_served_model_answers_as_documented(
    case: schemathesis.Case, fuzz_url: str, fuzz_key: str, identity_served: None
) -> None:
    assert case.path_parameters == {"model": "identity"}
    checks = [not_a_server_error_but_an_expired_job, *CHECKS[1:]]
    case.call_and_validate(base_url=fuzz_url, headers={"X-API-Key": fuzz_key}, checks=checks)


# Hostile cases the generated ones rarely reach (issue 18): each is put somewhere in a valid
# body, its free-form `inputs` included, of every route that takes JSON (a batch model takes no
# `parameters`: test_hostile_input plants values there).
HOSTILE_EXAMPLES = 60
HUGE_EXPONENT = "__1e400__"  # a literal Python cannot hold as a float: spliced in as text
# Each route's operation in the schema, its path parameters and a valid body.
BODIES: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "/v1/jobs": (
        "/v1/jobs",
        {},
        {"model": "identity", "inputs": {"x": 1}},
    ),
    "/v1/models/identity/predict": (
        "/v1/models/{model}/predict",
        {"model": "identity"},
        {"inputs": {"x": 1}},
    ),
    "/v1/chat/completions": (
        "/v1/chat/completions",
        {},
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "/v1/completions": (
        "/v1/completions",
        {},
        {"model": "smollm2", "prompt": "hi", "seed": 1},
    ),
}


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


hostile_values = st.one_of(
    st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"]),  # lone surrogates
    st.integers(min_value=2**64, max_value=2**200),
    st.integers(min_value=-(2**200), max_value=-(2**63) - 1),
    st.sampled_from([math.nan, math.inf, -math.inf, HUGE_EXPONENT]),
    st.integers(min_value=65, max_value=900).map(_nested),  # json.dumps recurses
)


def _plant(body: dict[str, Any], value: Any, where: int) -> dict[str, Any]:
    """`body` with `value` at one of its places: a free-form object, a key, a known field."""
    planted = json.loads(json.dumps(body))
    free_form = [planted[name] for name in ("inputs", "parameters") if name in planted]
    place = where % 3
    if place == 0 and free_form:
        free_form[where % len(free_form)]["hostile"] = value
    elif place == 1 and isinstance(value, str) and value != HUGE_EXPONENT:
        (free_form[0] if free_form else planted)[value] = 1
    elif "messages" in planted:
        planted["messages"][0]["content"] = value
    else:
        planted["seed" if "seed" in planted else "routing_key"] = value
    return planted


@given(path=st.sampled_from(sorted(BODIES)), value=hostile_values, where=st.integers(0, 5))
@settings(max_examples=HOSTILE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_values_anywhere_get_a_documented_4xx(
    fuzz_url: str, fuzz_key: str, path: str, value: Any, where: int
) -> None:
    """Sent as raw text (1e400 has no Python value), then held to the same schemathesis checks
    as the generated cases: no 5xx, a status, content type and error body the OpenAPI
    documents for the operation."""
    operation, path_parameters, valid = BODIES[path]
    body = _plant(valid, value, where)
    text = json.dumps(body).replace(f'"{HUGE_EXPONENT}"', "1e400")  # NaN, "\ud800" as JSON
    headers = {"X-API-Key": fuzz_key, "content-type": "application/json"}
    response = httpx.post(f"{fuzz_url}{path}", content=text.encode(), headers=headers, timeout=30)
    case = schema[operation]["POST"].Case(
        body=body, path_parameters=path_parameters, media_type="application/json"
    )
    case.validate_response(response, checks=CHECKS)
    assert response.status_code in (413, _refused_with(path)), (response.status_code, response.text)


def _refused_with(path: str) -> int:
    """The status of an invalid request: 422, and OpenAI's 400 on OpenAI's routes."""
    return 400 if path in OPENAI_PATHS else 422


def _documented(operation: str, method: str, where: str, name: str) -> dict[str, Any]:
    """The schema the OpenAPI gives a parameter (`where`: query) or a body property."""
    found = OPENAPI["paths"][operation][method]
    if where == "body":
        ref = found["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        model = OPENAPI["components"]["schemas"][ref.rsplit("/", 1)[1]]
        return cast(dict[str, Any], model["properties"][name])
    [parameter] = [p for p in found["parameters"] if p["in"] == where and p["name"] == name]
    return cast(dict[str, Any], parameter["schema"])


# (operation, where, name, a request carrying a value) for values the producer refuses
# (`_refused_with`) and accepts: what schemathesis' positive-data check cannot hold the whole
# API to (model input schemas and route weights are checked beyond what an OpenAPI can say),
# held here parameter by parameter.
DOCUMENTED_LIMITS = [
    (
        "/v1/completions",
        "body",
        "prompt",
        lambda url, key, value: httpx.post(
            f"{url}/v1/completions",
            json={"model": "no-such-model", "prompt": value},
            headers={"X-API-Key": key},
        ),
        ["", [], ["x", "y"]],
        ["x", ["x"]],
    ),
    (
        "/v1/batches",
        "query",
        "model",
        lambda url, key, value: httpx.post(
            f"{url}/v1/batches",
            params={"model": value},
            content=b"",
            headers={"X-API-Key": key, "content-type": "application/jsonl"},
        ),
        ["", "Bad Name", "a" * 64],
        ["no-such-model"],
    ),
]


@pytest.mark.parametrize(
    ("operation", "where", "name", "send", "refused", "accepted"), DOCUMENTED_LIMITS
)
def test_the_openapi_refuses_what_the_producer_refuses(
    fuzz_url: str,
    fuzz_key: str,
    operation: str,
    where: str,
    name: str,
    send: Any,
    refused: list[Any],
    accepted: list[Any],
) -> None:
    """A client generated from the OpenAPI (or schemathesis' positive-data check) must not
    send what the producer refuses, nor be kept from what it takes: an empty prompt list,
    a batch's model name that is not one."""
    documented = _documented(operation, "post", where, name)
    for value in refused:
        assert send(fuzz_url, fuzz_key, value).status_code == _refused_with(operation), value
        assert not jsonschema.Draft202012Validator(documented).is_valid(value), (value, documented)
    for value in accepted:
        assert send(fuzz_url, fuzz_key, value).status_code != _refused_with(operation), value
        assert jsonschema.Draft202012Validator(documented).is_valid(value), (value, documented)
