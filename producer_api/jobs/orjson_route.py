"""The jobs routes parse their JSON bodies with orjson (FastAPI's documented custom `APIRoute`
pattern): the stdlib parser is a fixed cost on every submit. The request boundary has already
refused what orjson would (integers past 64 bits, NaN, lone surrogates), so validation, errors
and the OpenAPI schema stay exactly FastAPI's."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            # orjson's decode error is a json.JSONDecodeError, which FastAPI answers as before
            self._json = orjson.loads(await self.body())
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_handler
