"""Nothing a client sends gets a 5xx, and no client's input disturbs another's stream: what a
hostile-input probe found (issue 18), each through the real producer and a real Valkey. Lone
surrogates, integers beyond 64 bits, non-finite numbers (inside free-form `inputs` and
`parameters` too) and deep nesting answer 422 (OpenAI's routes 400, as OpenAI's API); chunked
bodies over the limit 413; an unexpected
exception answers `internal` with a request id; a resume id beyond 64 bits is refused before the
shared token hub, which drops a stream Redis refuses without stalling the others. Entries on a
lane that no producer wrote, and a lane deleted under its worker, cost a real worker nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fastapi import APIRouter, FastAPI

from producer_api.app import create_app
from producer_api.errors import ConveyorError
from producer_api.jobs.orjson_route import OrjsonRoute
from producer_api.jobs.serving import check_parameters
from producer_api.openai import OPENAI_PATHS
from producer_api.openai.protocol import ChatCompletionRequest, CompletionRequest
from producer_api.token_hub import StreamUnreadable, TagReader
from shared.consumer_groups import ensure_groups
from shared.keys import GROUP, Keys
from shared.model_repository import ModelConfig, Variant
from shared.redis_client import connect
from shared.settings import Settings
from shared.webhook_events import allowed
from tests.conftest import until
from workers.partition.job_events import JobEvents
from workers.partition.partition import Partition
from workers.partition.reclaim import Reclaimer

pytestmark = pytest.mark.slow
SURROGATE = rb'"\ud800"'
TOO_BIG = b"18446744073709551616"  # 2**64
JSON = {"content-type": "application/json"}


def _post(base_url: str, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", content=body, headers={**JSON, **headers}, timeout=30)


def _refused(response: httpx.Response, status: int | None = None) -> dict[str, str]:
    """The documented error shape with `status`, by default the route's for an invalid request
    (422; OpenAI's routes answer as OpenAI's API does, 400); returns the error object."""
    if status is None:
        status = 400 if response.request.url.path in OPENAI_PATHS else 422
    assert response.status_code == status, (response.status_code, response.text)
    error: dict[str, str] = response.json()["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str)
    return error


def _nested(depth: int) -> bytes:
    """`inputs.x` holding `depth` nested lists (the body itself is two levels more)."""
    return b'{"model": "identity", "inputs": {"x": ' + b"[" * depth + b"]" * depth + b"}}"


CHAT = b'{"model": "smollm2", "messages": [{"role": "user", "content": %s}]}'
HOSTILE_STRINGS = {
    "job inputs": ("/v1/jobs", b'{"model": "identity", "inputs": {"a": %s}}'),
    "an inputs key": ("/v1/jobs", b'{"model": "identity", "inputs": {%s: 1}}'),
    "chat content": ("/v1/chat/completions", CHAT),
    "minilm texts": ("/v1/models/minilm/predict", b'{"inputs": {"texts": [%s]}}'),
}


@pytest.mark.parametrize("where", HOSTILE_STRINGS)
def test_a_lone_surrogate_is_refused(base_url: str, where: str) -> None:
    path, template = HOSTILE_STRINGS[where]
    error = _refused(_post(base_url, path, template % SURROGATE))
    assert "surrogate" in error["message"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/jobs", b'{"model": "identity", "inputs": {"x": %s}}' % TOO_BIG),
        ("/v1/jobs", b'{"model": "identity", "inputs": {"x": -9223372036854775809}}'),
        ("/v1/chat/completions", b'{"model": "smollm2", "seed": %s, "messages": []}' % TOO_BIG),
    ],
)
def test_an_integer_beyond_64_bits_is_refused(base_url: str, path: str, body: bytes) -> None:
    assert "64 bits" in _refused(_post(base_url, path, body))["message"]


def test_a_name_the_client_made_long_is_quoted_cut_short(base_url: str) -> None:
    """A 422 names where the body broke: an unknown field named in 100 KB was quoted whole."""
    body = {"model": "identity", "inputs": {}, "x" * 100_000: 1}
    message = _refused(_post(base_url, "/v1/jobs", json.dumps(body).encode()))["message"]
    assert len(message) < 1_000 and "(100002 characters of JSON)" in message, message[:300]
    assert "Extra inputs are not permitted" in message


def test_the_largest_64_bit_integers_round_trip(base_url: str, identity_worker: int) -> None:
    body = (
        b'{"model": "identity", "inputs": {"u": 18446744073709551615, "i": -9223372036854775808}}'
    )
    response = _post(base_url, "/v1/jobs?wait=20", body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == {"u": 2**64 - 1, "i": -(2**63)}


def test_floats_beyond_64_bit_integers_round_trip(base_url: str, identity_worker: int) -> None:
    """orjson reads an oversized integer as a float: a real float that large is taken."""
    body = b'{"model": "identity", "inputs": {"f": 1e20, "g": -9.3e18, "i": 7}}'
    response = _post(base_url, "/v1/jobs?wait=20", body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == {"f": 1e20, "g": -9.3e18, "i": 7}


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/jobs", {"parameters": {"max_tokens": 0}}, "parameters.max_tokens: Input should be"),
        ("/v1/jobs", {"parameters": {"max_tokens": "ten"}}, "parameters.max_tokens: Input"),
        ("/v1/jobs", {"parameters": {"max_tokens": True}}, "parameters.max_tokens: Input"),
        ("/v1/jobs", {"parameters": {"max_tokens": 1025}}, "at most 1024 for model smollm2"),
        ("/v1/chat/completions", {"max_tokens": 1025}, "at most 1024 for model smollm2"),
        ("/v1/jobs", {"parameters": {"temperature": -1}}, "parameters.temperature"),
        ("/v1/jobs", {"parameters": {"top_p": 0}}, "parameters.top_p"),
        ("/v1/jobs", {"parameters": {"presence_penalty": 9}}, "parameters.presence_penalty"),
        # named as sent, not by the union's branch (`parameters.stop.list[constrained-str].0`)
        ("/v1/jobs", {"parameters": {"stop": [""]}}, "parameters.stop.0: String should"),
        # one empty stop string is vLLM's [""]: refused by its SamplingParams, at the worker
        ("/v1/jobs", {"parameters": {"stop": ""}}, "parameters.stop: String should"),
        ("/v1/jobs", {"parameters": {"seed": 1.5}}, "parameters.seed"),
        ("/v1/chat/completions", {"stop": [""]}, "stop"),
        ("/v1/chat/completions", {"stop": ""}, "stop"),
        # a boolean or a string is no number (`true` ran as 1 token, or a temperature of 1.0)
        ("/v1/chat/completions", {"max_completion_tokens": True}, "max_completion_tokens"),
        ("/v1/chat/completions", {"temperature": True}, "temperature"),
        ("/v1/jobs", {"parameters": {"top_p": "0.5"}}, "parameters.top_p"),
        # not honoured, and the answer would differ: refused, not ignored
        ("/v1/chat/completions", {"logit_bias": {"50256": -100}}, "logit_bias"),
        ("/v1/completions", {"prompt": "Once", "suffix": "end."}, "suffix"),
        ("/v1/completions", {"prompt": "Once", "best_of": 3}, "best_of"),
        # JSON's own types, as OpenAI takes them: `true` is no 1, `0` no false
        ("/v1/chat/completions", {"n": True}, "n: Value error, must be an integer"),
        ("/v1/completions", {"prompt": "Once", "echo": 0}, "echo: Input should be a valid boolean"),
        ("/v1/completions", {"prompt": "Once", "best_of": 1.0}, "best_of: Value error"),
        ("/v1/chat/completions", {"stream": 1}, "stream: Input should be a valid boolean"),
        # a usage chunk asked for from a response that is no stream
        ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream is true"),
    ],
)
def test_sampling_the_engine_cannot_take_is_refused_and_nothing_is_enqueued(
    base_url: str, stack_redis: redis.Redis, path: str, body: dict[str, Any], says: str
) -> None:
    """A generate model's sampling parameters must be what vLLM takes, and `max_tokens` within
    its configured `max_tokens_limit` (smollm2: 1024): a job refused by the engine waited its
    turn in the queue first, and the engine would cut a longer one silently."""
    messages = [{"role": "user", "content": "hi"}]
    inputs = {"inputs": {"messages": messages}} if path == "/v1/jobs" else {"messages": messages}
    lane = Keys().queue("smollm2", "default")
    before = stack_redis.xlen(lane)
    response = httpx.post(
        f"{base_url}{path}", json={"model": "smollm2", **inputs, **body}, timeout=30
    )
    error = _refused(response)
    assert error["type"].startswith("invalid_request") and says in error["message"], error
    assert stack_redis.xlen(lane) == before


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/models/identity/predict"])
def test_a_batch_models_job_parameters_are_422_not_dropped(
    base_url: str, stack_redis: redis.Redis, path: str
) -> None:
    """A batch engine runs a job on its inputs alone: parameters were stored and ignored."""
    lane = Keys().queue("identity", "default")
    before = stack_redis.xlen(lane)
    body: dict[str, Any] = {"inputs": {"x": 1}, "parameters": {"normalize": False, "k": 2}}
    if path == "/v1/jobs":
        body["model"] = "identity"
    error = _refused(httpx.post(f"{base_url}{path}", json=body, timeout=30))
    assert error["message"].startswith("parameters.k, parameters.normalize: model identity takes")
    assert stack_redis.xlen(lane) == before
    bare = {"model": "identity", "inputs": {"x": 1}, "parameters": {}}
    assert httpx.post(f"{base_url}/v1/jobs", json=bare, timeout=30).status_code == 202


def test_a_list_of_prompts_is_400_not_one_completion_of_them_joined(
    base_url: str, stack_redis: redis.Redis
) -> None:
    """OpenAI completes each prompt of a list apart (LangChain sends lists); they were joined
    into one prompt and answered with one completion of the concatenation."""
    lane = Keys().queue("smollm2", "default")
    before = stack_redis.xlen(lane)
    body = {"model": "smollm2", "prompt": ["Tell me a joke.", "What is 2+2?"], "max_tokens": 4}
    error = _refused(httpx.post(f"{base_url}/v1/completions", json=body, timeout=30))
    assert "one prompt per request" in error["message"], error
    assert stack_redis.xlen(lane) == before
    assert CompletionRequest(model="smollm2", prompt=["Say hi."]).inputs() == {"prompt": "Say hi."}


def test_a_null_is_openais_default() -> None:
    """OpenAI's API takes null for its optional fields, and its SDK sends `n=None` or
    `stream=None` as given: they were 422s. A completion's null `max_tokens` is OpenAI's 16; it
    was dropped from the job, which then ran to the model's own default (256)."""
    nulls = {"n": None, "stream": None, "stream_options": None}
    nulls |= {"logit_bias": None, "echo": None, "suffix": None, "best_of": None}
    chat = ChatCompletionRequest.model_validate(
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **nulls}
    )
    assert not chat.stream and not chat.include_usage and chat.n is None
    streamed = {**nulls, "stream": True, "stream_options": {"include_usage": None}}
    assert not ChatCompletionRequest.model_validate(
        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], **streamed}
    ).include_usage
    completion = CompletionRequest.model_validate(
        {"model": "smollm2", "prompt": "Once", "max_tokens": None, **nulls}
    )
    assert completion.parameters()["max_tokens"] == 16
    assert (
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "suffix": ""}).suffix == ""
    )
    temperature = {"model": "smollm2", "prompt": "Once", "temperature": 1}  # an integer is one
    assert CompletionRequest.model_validate(temperature).parameters()["temperature"] == 1.0


def test_a_variants_own_max_tokens_limit_is_the_one_checked() -> None:
    """The engine of a variant takes the variant's parameters over the model's; the check at
    submit read the model's alone, so a request past the variant's limit was cut, not refused."""
    config = ModelConfig(
        name="llm",
        kind="generate",
        backend="vllm",
        parameters={"max_tokens_limit": 1024},
        variants={"default": Variant(), "small": Variant(parameters={"max_tokens_limit": 64})},
    )
    check_parameters(config, "default", {"max_tokens": 100})
    with pytest.raises(ConveyorError, match="at most 64 for model llm:small"):
        check_parameters(config, "small", {"max_tokens": 100})


def _identity_round_trip(base_url: str, inputs: dict[str, str]) -> None:
    response = httpx.post(
        f"{base_url}/v1/jobs?wait=20", json={"model": "identity", "inputs": inputs}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == inputs


def test_entries_no_producer_wrote_are_acknowledged_and_the_worker_serves_on(
    base_url: str, identity_worker: int, stack_redis: redis.Redis
) -> None:
    """Entries a real worker cannot decode (fields missing, a payload that is not JSON, a
    timestamp that is not a number), put on its lane by anything but a producer, are logged and
    acknowledged (so deleted) without killing it; the job behind them runs."""
    stream = Keys().queue("identity", "default")
    foreign = [
        stack_redis.xadd(stream, {"junk": "1"}),
        stack_redis.xadd(stream, {"id": "x", "payload": "{not json", "enq": "1"}),
        stack_redis.xadd(stream, {"id": "y", "payload": "{}", "enq": "soon"}),
    ]
    _identity_round_trip(base_url, {"after": "foreign entries"})
    until(lambda: not any(stack_redis.xrange(stream, entry, entry) for entry in foreign))
    _identity_round_trip(base_url, {"and": "after them"})


def test_a_lane_deleted_under_its_worker_is_made_again_and_served(
    base_url: str, identity_worker: int, stack_redis: redis.Redis
) -> None:
    """A lane stream that vanishes under a worker blocked on it (an operator's DEL, a Redis back
    without its data): the worker's read gets NOGROUP, the group is made again, and the jobs
    after it run."""
    stream = Keys().queue("identity", "default")
    _identity_round_trip(base_url, {"before": "the lane went"})
    assert stack_redis.delete(stream) == 1
    for n in range(3):
        _identity_round_trip(base_url, {"after": f"the lane went {n}"})
    assert [group["name"] for group in stack_redis.xinfo_groups(stream)] == [GROUP]


@pytest.mark.parametrize("turn", ["reclaim", "housekeep"])
async def test_a_reclaim_pass_on_a_vanished_lane_makes_its_group_again(
    aredis: aioredis.Redis, turn: str
) -> None:
    """The reclaimer's turn can come first after a lane vanished (before any read met NOGROUP):
    it finds nothing to reclaim and makes the groups again, rather than killing its worker. The
    pass's housekeeping also runs on its own while a reclaimed entry is in hand: its consumer
    listing met 'no such key', and the error ended the worker's loop."""
    config = ModelConfig(name="m", kind="batch", backend="identity")
    keys = Keys(f"vanished-{turn}:")
    partition = Partition.of(keys, config, "default")
    await ensure_groups(aredis, partition.streams)
    reclaimer = Reclaimer(aredis, keys, partition, "box-1-1", 60, JobEvents("redis://unused"))
    await aredis.delete(*partition.streams)

    if turn == "reclaim":
        assert await reclaimer.reclaim(partition.online) == []
    else:
        await reclaimer.housekeep()
    for stream in partition.streams:
        assert [group["name"] for group in await aredis.xinfo_groups(stream)] == [GROUP.encode()]


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
@pytest.mark.parametrize(
    "template",
    [
        b'{"model": "identity", "inputs": {"x": {"deep": [%s]}}}',
        b'{"model": "identity", "inputs": {}, "parameters": {"p": %s}}',
    ],
)
def test_a_non_finite_number_in_a_free_form_object_is_422(
    base_url: str, number: bytes, template: bytes
) -> None:
    assert "finite" in _refused(_post(base_url, "/v1/jobs", template % number))["message"]


@pytest.mark.parametrize("depth", [63, 255, 600, 990, 5000])
@pytest.mark.parametrize("idempotent", [False, True])
def test_nesting_deeper_than_the_limit_is_422(base_url: str, depth: int, idempotent: bool) -> None:
    headers = {"Idempotency-Key": f"deep-{depth}"} if idempotent else {}
    error = _refused(_post(base_url, "/v1/jobs", _nested(depth), **headers))
    assert "nested deeper than 64" in error["message"]


# Starlette reads a repeated header's first value; the boundary read the last one.
TWO_TYPES = [("content-type", "application/json"), ("content-type", "text/plain")]


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/jobs", _nested(300), "nested deeper than 64"),
        ("/v1/jobs", b'{"model": "identity", "inputs": {"x": %s}}' % TOO_BIG, "64 bits"),
        ("/v1/chat/completions", CHAT % (b"[" * 5000 + b"]" * 5000), "nested deeper than 64"),
    ],
)
def test_a_second_content_type_does_not_skip_the_checks(
    base_url: str, path: str, body: bytes, says: str
) -> None:
    """`application/json` then `text/plain`: the boundary took the body for text and let it
    through unchecked, and the route parsed it as JSON all the same: 300 levels were a 500
    (orjson cannot write them), 2**64 a float (202), 5000 levels a 400."""
    response = httpx.post(f"{base_url}{path}", content=body, headers=TWO_TYPES, timeout=30)
    assert says in _refused(response)["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_nested(300), "nested deeper than 64"),
        (b'{"model": "identity", "inputs": {"x": %s}}' % TOO_BIG, "64 bits"),
        (b'{"model": "identity", "inputs": {"x": NaN}}', "finite"),
    ],
)
async def test_a_jobs_route_checks_a_body_no_boundary_parsed(body: bytes, says: str) -> None:
    """A jobs route parses a body itself only when no boundary did (none in front): with the
    boundary's checks, not a bare orjson.loads, which took 1024 levels and 2**64 as a float."""
    router = APIRouter(route_class=OrjsonRoute)

    @router.post("/echo")
    async def echo(value: dict[str, Any]) -> dict[str, Any]:
        return value

    app = FastAPI()
    app.include_router(router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        response = await client.post("/echo", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    assert says in response.json()["detail"][0]["ctx"]["error"]


def test_nesting_within_the_limit_round_trips(base_url: str, identity_worker: int) -> None:
    response = _post(base_url, "/v1/jobs?wait=20", _nested(60), **{"Idempotency-Key": "deep-60"})
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "succeeded", job
    assert job["outputs"] == json.loads(_nested(60))["inputs"]  # the identity model's echo


@pytest.mark.parametrize(
    "path", ["/v1/jobs", "/v1/chat/completions", "/v1/models/identity/predict"]
)
def test_a_chunked_body_over_the_limit_is_413(base_url: str, path: str) -> None:
    """No Content-Length: the limit (1 MiB) is found while reading, still a 413."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "identity", "inputs": {"x": "'
        for _ in range(80):
            yield b"a" * 16_384
        yield b'"}}'

    response = httpx.post(f"{base_url}{path}", content=chunks(), headers=JSON, timeout=30)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert _refused(response, 413)["type"] == "payload_too_large"


async def test_an_unexpected_exception_answers_internal_with_a_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The safety net itself: a route that raises (a bug) still answers the documented shape,
    and the traceback is logged under the id the client got."""
    app = create_app(Settings(auth="disabled"))

    async def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/broken", broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="producer_api.errors"):
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            response = await client.get("/broken")
    error = _refused(response, 500)
    assert error["type"] == "internal"
    request_id = error["request_id"]
    assert response.headers["x-request-id"] == request_id and request_id in error["message"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged and logged[0].exc_info is not None and "a bug" in str(logged[0].exc_info[1])


@pytest.mark.parametrize("bad", ["99999999999999999999-0", "1-18446744073709551616"])
def test_a_resume_id_beyond_64_bits_is_422(base_url: str, identity_worker: int, bad: str) -> None:
    job = _post(base_url, "/v1/jobs", b'{"model": "identity", "inputs": {}}').json()
    response = httpx.get(
        f"{base_url}/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": bad}, timeout=30
    )
    assert "Last-Event-ID" in _refused(response)["message"]


async def test_the_hub_drops_a_stream_redis_refuses_and_serves_the_others(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A followed key that is no stream makes Redis refuse the hub's whole XREAD: only its
    listener is told, and the good stream's new entry still arrives at once."""
    redis_client.set("bad-stream", "not a stream")
    client = connect(redis_url, blocks_ms=0)
    hub = TagReader(redis_url, client, "hub-wake", "hub-test")
    await hub.start()
    try:
        with pytest.raises(ValueError, match="not a stream entry id"):
            async with hub.listen("good-stream", "99999999999999999999-0"):
                pass
        async with hub.listen("good-stream", "0-0") as good, hub.listen("bad-stream", "0-0") as bad:
            dropped = await asyncio.wait_for(bad.get(), 5)
            assert isinstance(dropped, StreamUnreadable)
            await client.xadd("good-stream", {"kind": "token", "text": "hi", "tokens": 1})
            rows = await asyncio.wait_for(good.get(), 2)
            assert not isinstance(rows, StreamUnreadable) and rows[0][1][b"text"] == b"hi"
    finally:
        await hub.stop()
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/conveyor/../../admin",
        "https://hooks.example.com/conveyor/%2e%2e/admin",
        "https://hooks.example.com/conveyor/./../admin",
        "https://hooks.example.com/conveyor/..",
    ],
)
def test_a_webhook_cannot_leave_its_allowed_prefix_through_dot_segments(url: str) -> None:
    rules = ["https://hooks.example.com/conveyor"]
    assert allowed("https://hooks.example.com/conveyor/a/../b", rules)  # still inside
    assert not allowed(url, rules)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/jobs/0123", "DELETE, GET, HEAD"),
        ("PATCH", "/v1/models/identity/canary", "DELETE, GET, HEAD, POST"),
        ("DELETE", "/v1/jobs", "POST"),
    ],
)
def test_a_method_a_path_does_not_take_is_405_naming_every_one_it_does(
    base_url: str, method: str, path: str, allowed: str
) -> None:
    """RFC 9110: a 405's Allow lists all the resource's methods, not one route's."""
    response = httpx.request(method, f"{base_url}{path}")
    assert response.status_code == 405
    assert response.headers["allow"] == allowed
    assert response.json()["error"]["type"] == "http_error"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/0123?wait=nan"),
        ("POST", "/v1/models/identity/predict?timeout=inf"),
        ("GET", "/v1/experiments/identity?window_s=nan"),
    ],
)
def test_a_non_finite_number_in_a_query_is_422_saying_so(
    base_url: str, method: str, path: str
) -> None:
    """`nan` was refused as "less than or equal to 600", a bound it does not break."""
    response = httpx.request(method, f"{base_url}{path}", json={"inputs": {}})
    assert response.status_code == 422
    assert "Input should be a finite number" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),  # curl -d
        ("Text/Plain; charset=utf-8", "text/plain"),
        (None, "missing"),
    ],
)
def test_a_body_not_sent_as_json_says_how_to_send_it(
    base_url: str, path: str, content_type: str | None, named: str
) -> None:
    """`curl -d '{...}'` without `-H 'Content-Type: application/json'` got "body: Input should
    be a valid dictionary or object to extract fields from": true of a body never read as JSON,
    and no help."""
    headers = {"content-type": content_type} if content_type else {}
    body = b'{"model": "identity", "inputs": {"text": "x"}}'
    response = httpx.post(f"{base_url}{path}", content=body, headers=headers, timeout=30)
    assert _refused(response)["message"] == (
        f"body: send a JSON object with Content-Type: application/json (this request's is "
        f"{named}; curl needs -H 'Content-Type: application/json')"
    )


def test_a_json_body_that_is_not_an_object_is_422_saying_so(base_url: str) -> None:
    response = _post(base_url, "/v1/jobs", b"[1, 2]")
    assert _refused(response)["message"].startswith("body: Input should be a valid dictionary")
