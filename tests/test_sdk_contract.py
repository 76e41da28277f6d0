"""Contract between the producer's OpenAPI schema and the SDK's types (`conveyor/client/types.py`):
every response shape an SDK call parses must parse, field for field, as the SDK type.

Two checks per (operation, status) the SDK reads, with the schema built in-process from
`producer_api.app`:
- coverage: every property the server's schema declares, at any depth the SDK models, is a
  field of the SDK type (its models keep unknown fields, so a missing one would pass silently);
- parsing: instances generated from the server's schema (with Hypothesis: optional fields left
  out, nulls where allowed, any string or number the schema permits) parse with the SDK type
  and every declared field reads back the value the server sent.
Every JSON response of the schema is either read by the SDK (below) or listed as not read by
it, so a new endpoint cannot slip past this test. `test_fuzz_api.py` checks the other half:
the running producer's responses match the schema."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from typing import Any, Union, get_args, get_origin

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from pydantic import BaseModel

from conveyor.client import calls
from conveyor.client.errors import APIError, WaitTimeout, raise_for_error
from conveyor.client.types import (
    Batch,
    BatchList,
    ChatCompletion,
    ChatCompletionChunk,
    EmbeddingList,
    Job,
)
from producer_api.app import create_app
from producer_api.openai.protocol import ChatCompletionChunk as ServerChatCompletionChunk

# Random examples each run (no example database: nothing written to the tree).
CONTRACT = settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
SCHEMA: dict[str, Any] = create_app().openapi()
COMPONENTS: dict[str, Any] = SCHEMA["components"]["schemas"]

# (method, path, status) → the SDK type that parses that response body.
SDK_READS: dict[tuple[str, str, str], type[BaseModel]] = {
    ("post", "/v1/jobs", "200"): Job,
    ("post", "/v1/jobs", "202"): Job,
    ("get", "/v1/jobs/{job_id}", "200"): Job,
    ("delete", "/v1/jobs/{job_id}", "200"): Job,
    ("post", "/v1/models/{model}/predict", "200"): Job,
    ("post", "/v1/models/{model}/predict", "202"): Job,
    ("post", "/v1/chat/completions", "200"): ChatCompletion,
    ("post", "/v1/embeddings", "200"): EmbeddingList,
    ("post", "/v1/batches", "202"): Batch,
    ("get", "/v1/batches", "200"): BatchList,
    ("get", "/v1/batches/{batch_id}", "200"): Batch,
    ("post", "/v1/batches/{batch_id}/cancel", "200"): Batch,
}
# JSONL files, not one JSON document: the SDK parses each line (BatchOutput, BatchError).
JSONL_FILES = {
    ("get", "/v1/batches/{batch_id}/output"),
    ("get", "/v1/batches/{batch_id}/errors"),
    ("get", "/v1/files/{file_id}/content"),
}
# Operations whose successful JSON response the SDK does not read (no SDK call exists for
# them); an operation missing from both tables fails `test_every_response_is_classified`.
NOT_READ_BY_SDK = {
    ("post", "/v1/completions"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model}"),
    ("get", "/v1/models/{model}/routes"),
    ("put", "/v1/models/{model}/routes"),
    ("delete", "/v1/models/{model}/routes"),
    ("get", "/v1/models/{model}/canary"),
    ("post", "/v1/models/{model}/canary"),
    ("delete", "/v1/models/{model}/canary"),
    ("get", "/v1/experiments/{model}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    # OpenAI's Files API, for its clients: the SDK sends a batch's lines in the request itself.
    ("post", "/v1/files"),
    ("get", "/v1/files"),
    ("get", "/v1/files/{file_id}"),
    ("delete", "/v1/files/{file_id}"),
}


# Keywords that only describe; every other keyword must be one `from_schema` understands, so a
# schema feature it would ignore fails the test instead of widening or narrowing what it draws.
_ANNOTATIONS = {"title", "description", "default", "examples"}
_UNDERSTOOD = {
    *_ANNOTATIONS,
    *("type", "properties", "required", "additionalProperties", "items", "anyOf", "enum"),
    *("const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength"),
    *("maxLength", "pattern", "minItems", "maxItems"),
}
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def from_schema(schema: dict[str, Any]) -> SearchStrategy[Any]:
    """Every JSON value a (resolved) schema of the subset pydantic emits allows."""
    if unknown := set(schema) - _UNDERSTOOD:
        raise NotImplementedError(f"schema keywords {sorted(unknown)}: teach from_schema")
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    kinds = schema.get("type")
    if kinds is None:
        return _JSON
    if isinstance(kinds, list):
        return st.one_of([from_schema({**schema, "type": kind}) for kind in kinds])
    return _TYPED[kinds](schema)


def _number(schema: dict[str, Any], integers: bool) -> SearchStrategy[Any]:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_open, high_open = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if integers:
        low = low if low_open is None else low_open + 1
        high = high if high_open is None else high_open - 1
        return st.integers(min_value=low, max_value=high)
    return st.floats(
        min_value=low if low_open is None else low_open,
        max_value=high if high_open is None else high_open,
        exclude_min=low_open is not None,
        exclude_max=high_open is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def _string(schema: dict[str, Any]) -> SearchStrategy[str]:
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 12))


def _array(schema: dict[str, Any]) -> SearchStrategy[list[Any]]:
    items = from_schema(schema.get("items", {}))
    return st.lists(items, min_size=schema.get("minItems", 0), max_size=schema.get("maxItems", 3))


def _object(schema: dict[str, Any]) -> SearchStrategy[dict[str, Any]]:
    """Required properties always, optional ones sometimes, extra ones where allowed."""
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    extra = schema.get("additionalProperties", not properties)
    extras: SearchStrategy[dict[str, Any]] = st.just({})
    if extra is not False:
        values = _JSON if extra is True else from_schema(extra)
        names = st.text(max_size=8).filter(lambda name: name not in properties)
        extras = st.dictionaries(names, values, max_size=3)
    return st.builds(
        lambda fixed, optional, more: {**more, **fixed, **optional},
        st.fixed_dictionaries({n: from_schema(properties[n]) for n in required}),
        st.fixed_dictionaries(
            {}, optional={n: from_schema(s) for n, s in properties.items() if n not in required}
        ),
        extras,
    )


_TYPED: dict[str, Any] = {
    "null": lambda _: st.none(),
    "boolean": lambda _: st.booleans(),
    "integer": lambda schema: _number(schema, integers=True),
    "number": lambda schema: _number(schema, integers=False),
    "string": _string,
    "array": _array,
    "object": _object,
}


def inlined(schema: Any, definitions: dict[str, Any]) -> Any:
    """`schema` with every local reference (`#/components/schemas/X`, `#/$defs/X`) replaced by
    its target in `definitions`."""
    if isinstance(schema, list):
        return [inlined(item, definitions) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if ref := schema.get("$ref"):
        return inlined(definitions[ref.rsplit("/", 1)[-1]], definitions)
    return {key: inlined(value, definitions) for key, value in schema.items() if key != "$defs"}


def resolved(schema: Any) -> Any:
    return inlined(schema, COMPONENTS)


def json_responses() -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(method, path, status, resolved schema) of every JSON response body in the schema."""
    for path, operations in SCHEMA["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {}).get("application/json")
                if content is not None and "schema" in content:
                    yield method, path, status, resolved(content["schema"])


def sdk_read_cases() -> list[Any]:
    return [
        pytest.param(model, resolved_schema, id=f"{method} {path} {status}")
        for method, path, status, resolved_schema in json_responses()
        if (model := SDK_READS.get((method, path, status))) is not None
    ]


def error_cases() -> list[Any]:
    return [
        pytest.param(int(status), resolved_schema, id=f"{method} {path} {status}")
        for method, path, status, resolved_schema in json_responses()
        if int(status) >= 400
    ]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The SDK models an annotation holds (`Usage | None`, `list[ChatChoice]`...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (list, Union, types.UnionType):
        return [model for arg in get_args(annotation) for model in _models_in(arg)]
    return []


def _objects_in(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The object schemas a property's schema may hold (through anyOf, nulls, arrays)."""
    if "anyOf" in schema:
        return [found for option in schema["anyOf"] for found in _objects_in(option)]
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        return _objects_in(schema["items"])
    return [schema] if "properties" in schema else []


def missing_fields(model: type[BaseModel], schema: dict[str, Any], at: str = "") -> list[str]:
    """Properties of `schema` that `model` does not declare, as dotted paths, recursing into
    every property that the SDK parses into a model of its own."""
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    missing: list[str] = []
    for name, subschema in schema.get("properties", {}).items():
        if name not in fields:
            missing.append(f"{at}{name}")
            continue
        for inner in _models_in(fields[name].annotation):
            for obj in _objects_in(subschema):
                missing.extend(missing_fields(inner, obj, f"{at}{name}."))
    return missing


def reads_back(model: BaseModel, sent: Any) -> dict[str, tuple[Any, Any]]:
    """Declared fields whose parsed value differs from what the server sent: (sent, read)."""
    parsed = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return {
        name: (sent.get(name), parsed.get(name))
        for name in model.model_fields_set
        if parsed.get(name) != sent.get(name)
    }


@pytest.mark.parametrize(("model", "schema"), sdk_read_cases())
def test_sdk_type_declares_every_field_the_server_returns(
    model: type[BaseModel], schema: dict[str, Any]
) -> None:
    assert missing_fields(model, schema) == []


def assert_parses(model: type[BaseModel], schema: dict[str, Any]) -> None:
    """Every body `schema` allows parses as `model`, each declared field as it was sent."""

    @CONTRACT
    @given(from_schema(schema))
    def parses(body: dict[str, Any]) -> None:
        parsed = model.model_validate(body)
        assert reads_back(parsed, body) == {}

    parses()


@pytest.mark.parametrize(("model", "schema"), sdk_read_cases())
def test_sdk_type_parses_every_response_the_schema_allows(
    model: type[BaseModel], schema: dict[str, Any]
) -> None:
    assert_parses(model, schema)


def test_streamed_chat_chunks_parse_as_the_sdk_chunk() -> None:
    """Chunks go out as server-sent events, outside the OpenAPI document: their server model
    is the schema here."""
    raw = ServerChatCompletionChunk.model_json_schema(mode="serialization")
    schema = inlined(raw, raw.get("$defs", {}))
    assert missing_fields(ChatCompletionChunk, schema) == []
    assert_parses(ChatCompletionChunk, schema)


@pytest.mark.parametrize(("status", "schema"), error_cases())
def test_sdk_raises_every_error_body_with_its_type_and_message(
    status: int, schema: dict[str, Any]
) -> None:
    @settings(CONTRACT, max_examples=10)
    @given(from_schema(schema))
    def raises(body: dict[str, Any]) -> None:
        with pytest.raises(APIError) as raised:
            raise_for_error(httpx.Response(status, json=body))
        assert (raised.value.status, raised.value.type) == (status, body["error"]["type"])
        assert raised.value.message == body["error"]["message"]

    raises()


def test_every_response_is_classified() -> None:
    """A new endpoint (or a new success status) is either read by the SDK, with its type in
    SDK_READS, or listed in NOT_READ_BY_SDK."""
    unclassified = [
        (method, path, status)
        for method, path, status, _ in json_responses()
        if int(status) < 400
        and (method, path, status) not in SDK_READS
        and (method, path) not in NOT_READ_BY_SDK
    ]
    assert unclassified == []
    documented = {(method, path, status) for method, path, status, _ in json_responses()}
    assert set(SDK_READS) - documented == set(), "an SDK call reads a response no longer served"
    assert NOT_READ_BY_SDK - {(method, path) for method, path, _ in documented} == set()


def test_jsonl_files_are_documented_as_jsonl() -> None:
    """A file route's 200 says what it sends (`application/jsonl`), not JSON, so clients and
    schema checks expect lines; its errors, like every route's, are documented as JSON."""
    for method, path in JSONL_FILES:
        content = SCHEMA["paths"][path][method]["responses"]["200"]["content"]
        assert list(content) == ["application/jsonl"], (path, content)
    for path, operations in SCHEMA["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400 and "content" in response:
                    assert list(response["content"]) == ["application/json"], (method, path)


def test_the_checks_catch_drift() -> None:
    """The two checks above fail on the drifts they exist for: a field the SDK lacks, and a
    field the SDK requires that the server may leave out or send as null."""

    class Narrow(BaseModel):
        id: str
        status: str

    class Strict(BaseModel):
        id: str
        model: str

    job_view = resolved(COMPONENTS["JobView"])
    assert "outputs" in missing_fields(Narrow, job_view)
    found = from_schema(job_view).filter(lambda body: body.get("model") is None)

    @settings(CONTRACT, max_examples=5)
    @given(found)
    def rejected(body: dict[str, Any]) -> None:
        with pytest.raises(ValueError):
            Strict.model_validate(body)

    rejected()


@pytest.mark.parametrize("timeout", [0.0, 1e-9])
def test_a_predict_with_no_time_left_asks_only_what_the_routes_accept(timeout: float) -> None:
    """`predict(timeout=0)`, or one whose timeout ran out before its request went out, asked
    `/predict` for `timeout=0.0`, which it refuses as not over 0: every such call failed with
    a 422. It submits, and its wait ends as `wait(timeout=0)` does: WaitTimeout with the job."""
    op = calls.predict("m", {"x": 1}, timeout, "key", {})
    submit = next(op)
    assert _accepts("post", "/v1/jobs", "wait", submit)
    queued = {"id": "j", "status": "queued"}
    poll = op.send(httpx.Response(202, json=queued))
    assert _accepts("get", "/v1/jobs/{job_id}", "wait", poll)
    with pytest.raises(WaitTimeout) as raised:
        op.send(httpx.Response(200, json=queued))
    assert raised.value.last == Job.model_validate(queued)


def _accepts(method: str, path: str, name: str, call: calls.Call) -> bool:
    """Whether the query parameter `name` of `call` is within the bounds the route declares."""
    [declared] = [
        parameter["schema"]
        for parameter in SCHEMA["paths"][path][method]["parameters"]
        if parameter["name"] == name
    ]
    value = (call.params or {})[name]
    return (
        value > declared.get("exclusiveMinimum", -math.inf)
        and value >= declared.get("minimum", -math.inf)
        and value <= declared.get("maximum", math.inf)
    )
