"""How the producer is wired, checked on the app itself (no stack): every dependency a route
resolves is async, because FastAPI runs a plain `def` dependency in its thread pool, a thread
hand-off per request on the hot path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from producer_api.app import create_app


def _dependencies(dependant: Dependant) -> Iterator[Dependant]:
    for sub in dependant.dependencies:
        yield sub
        yield from _dependencies(sub)


def sync_dependencies(app: FastAPI) -> list[str]:
    """`METHOD path: dependency` for every dependency a route resolves in the thread pool."""
    found: list[str] = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        for sub in _dependencies(route.dependant):
            awaited = sub.is_coroutine_callable or sub.is_async_gen_callable
            if sub.call is not None and not awaited:
                found.append(f"{sorted(route.methods)} {route.path}: {sub.call!r}")
    return found


def test_every_route_dependency_is_async() -> None:
    app = create_app()
    routes = [route for route in app.routes if isinstance(route, APIRoute)]
    assert sum(len(list(_dependencies(route.dependant))) for route in routes) > len(routes)
    assert sync_dependencies(app) == []


def blocking() -> int:
    """Module level: FastAPI resolves the string annotations below in the module's globals."""
    return 1


def test_a_sync_dependency_is_found() -> None:
    app = FastAPI()

    @app.get("/x")
    async def route(value: Annotated[int, Depends(blocking)]) -> int:
        return value

    assert sync_dependencies(app) == [f"['GET'] /x: {blocking!r}"]
