"""The jobs routes take their JSON bodies as the request boundary parsed them (FastAPI's
documented custom `APIRoute` pattern): a body is parsed once per submit, not twice. The boundary
has already refused what orjson would (integers past 64 bits, NaN, lone surrogates), so
validation, errors and the OpenAPI schema stay exactly FastAPI's. A body the boundary did not
parse (no boundary in front) gets the boundary's checks here: never a bare parse."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from producer_api.request_boundary import NOT_PARSED, PARSED_JSON, parse_json
from shared.settings import get_settings


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            parsed = self.scope.get(PARSED_JSON, NOT_PARSED)
            self._json = await self._checked() if parsed is NOT_PARSED else parsed
        return self._json

    async def _checked(self) -> Any:
        """The body as the boundary would take it. Every refusal leaves as a JSONDecodeError
        naming why: the one error FastAPI answers 422 (`json_invalid`); any other is a 400."""
        body = await self.body()
        try:
            return parse_json(body, get_settings().max_json_depth)
        except json.JSONDecodeError:
            raise
        except ValueError as exc:  # UnstorableJson, UnicodeDecodeError
            raise json.JSONDecodeError(str(exc), body.decode(errors="replace"), 0) from None


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_handler
