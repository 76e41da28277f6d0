"""JSON responses rendered by the shared orjson codec: job views carry large float arrays
(embeddings), which the standard encoder is slow at."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from shared.codec import dumps


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content)
