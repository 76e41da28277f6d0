"""JSON responses rendered by the shared orjson codec: job views carry large float arrays
(embeddings), which the standard encoder is slow at."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, StreamingResponse

from shared.codec import dumps

JSONL = "application/jsonl"


class JsonlResponse(StreamingResponse):
    """JSON Lines streamed as stored (batch files, uploads); as a route's `response_class`
    it is what the OpenAPI documents, not JSON."""

    media_type = JSONL


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content)


def page_response(data: list[dict[str, Any]], has_more: bool) -> FastJSONResponse:
    """A page of OpenAI's cursor lists (batches, files): the next page is `after=last_id`."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    page = {"object": "list", "data": data, "first_id": first, "last_id": last}
    return FastJSONResponse({**page, "has_more": has_more})
