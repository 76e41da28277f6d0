"""JSON responses rendered by the shared orjson codec: job views carry large float arrays
(embeddings), which the standard encoder is slow at."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from shared.codec import dumps

JSONL = "application/jsonl"


class JsonlResponse(StreamingResponse):
    """JSON Lines streamed as stored (batch files, uploads)."""

    media_type = JSONL


def jsonl_route(errors: dict[int | str, dict[str, Any]]) -> dict[str, Any]:
    """A route's OpenAPI arguments when it answers a JsonlResponse: its 200 is lines, its
    `errors` JSON. FastAPI documents error models in the route class's media type, so the class
    it is given names none, and the 200 says what it is."""
    lines = {200: {"content": {JSONL: {"schema": {"type": "string"}}}}}
    return {"response_class": Response, "responses": {**lines, **errors}}


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content)


def page_response(data: list[dict[str, Any]], has_more: bool) -> FastJSONResponse:
    """A page of OpenAI's cursor lists (batches, files): the next page is `after=last_id`, its
    last record's id, as OpenAI's clients take it (an empty page is the last:
    shared/tenant_index.Page)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    page = {"object": "list", "data": data, "first_id": first, "last_id": last}
    return FastJSONResponse({**page, "has_more": has_more})
