"""The path a request's routes are matched against: past the ASGI root_path. Uvicorn's
--root-path (FastAPI's way behind a path-stripping proxy) puts the root path before the
request's path; Starlette's router reads past it, and a middleware comparing the whole path
with a route's bare path stopped knowing its routes under a prefix."""

from __future__ import annotations

from starlette.types import Scope


def route_path(scope: Scope) -> str:
    """The request's path past its root path, as Starlette's router reads it (its own
    `get_route_path` is private): cut only at a segment's end, so root `/conveyor` leaves
    `/conveyorx/...` whole. The path itself where there is no root path (the common case: one
    lookup)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path
