"""The jobs routes take their JSON bodies as the request boundary parsed them (FastAPI's
documented custom `APIRoute` pattern): a body is parsed once per submit, not twice. The boundary
has already refused what orjson would (integers past 64 bits, NaN, lone surrogates), so
validation, errors and the OpenAPI schema stay exactly FastAPI's."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from producer_api.request_boundary import NOT_PARSED, PARSED_JSON


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            parsed = self.scope.get(PARSED_JSON, NOT_PARSED)
            # orjson's decode error is a json.JSONDecodeError, which FastAPI answers as before
            self._json = orjson.loads(await self.body()) if parsed is NOT_PARSED else parsed
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_handler
