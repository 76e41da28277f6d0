"""The jobs routes parse bodies with orjson: a body only the stdlib parser accepts (a NaN
literal) is refused as invalid JSON, in FastAPI's own error shape, by an orjson route. Behind
the request boundary, which has parsed the body already, they take its value."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from producer_api.jobs.api_router import router as jobs_router
from producer_api.jobs.orjson_route import OrjsonRoute
from producer_api.request_boundary import PARSED_JSON


class Body(BaseModel):
    x: float


def _client(route_class: type[APIRoute]) -> TestClient:
    return TestClient(_app(route_class))


def _app(route_class: type[APIRoute]) -> FastAPI:
    router = APIRouter(route_class=route_class)

    @router.post("/echo")
    async def echo(body: Body) -> dict[str, float]:
        return {"x": body.x}

    app = FastAPI()
    app.include_router(router)
    return app


def test_an_orjson_route_parses_with_orjson() -> None:
    headers = {"Content-Type": "application/json"}
    assert _client(OrjsonRoute).post("/echo", content=b'{"x": 1.5}', headers=headers).json() == {
        "x": 1.5
    }
    refused = _client(OrjsonRoute).post("/echo", content=b'{"x": NaN}', headers=headers)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["type"] == "json_invalid"
    stdlib = _client(APIRoute).post("/echo", content=b'{"x": NaN}', headers=headers)
    assert stdlib.status_code == 200  # the stdlib parser takes it: the check above can fail


def test_every_jobs_route_is_an_orjson_route() -> None:
    assert jobs_router.routes
    assert all(isinstance(route, OrjsonRoute) for route in jobs_router.routes)


def test_an_orjson_route_takes_the_value_the_boundary_left() -> None:
    app: ASGIApp = _app(OrjsonRoute)

    async def parsed_elsewhere(scope: Scope, receive: Receive, send: Send) -> None:
        scope[PARSED_JSON] = {"x": 2.5}  # the boundary's value, not the body's
        await app(scope, receive, send)

    client = TestClient(parsed_elsewhere)
    headers = {"Content-Type": "application/json"}
    assert client.post("/echo", content=b'{"x": 1.5}', headers=headers).json() == {"x": 2.5}
