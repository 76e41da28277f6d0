"""This producer's copy of every model's live routes. One cheap GET of the global routes
version every POLL_S tells it whether anything changed; only then are the routes read again, so
a change made through any replica applies here within POLL_S plus one round trip, without a
restart. Models without live routes yet are seeded from config.yaml on the first poll, which the
app's startup awaits: a producer serves its first request by the live routes."""

from __future__ import annotations

import asyncio
import logging

from shared.metrics import ROUTES_VERSION
from shared.model_repository import ModelConfig, ModelRepository
from shared.route_store import RouteStore
from shared.routing import Routes, seed_routes, served_routes

log = logging.getLogger(__name__)

POLL_S = 0.1


class LiveRoutes:
    def __init__(self, store: RouteStore, repository: ModelRepository) -> None:
        self.store = store
        self.repository = repository
        self._routes: dict[str, Routes] = {}
        self._version = -1
        self._warned: dict[str, tuple[int, str | None]] = {}
        self._reloading = asyncio.Lock()

    def of(self, config: ModelConfig) -> Routes:
        """The model's live routes (config.yaml's until a poll has read them: Redis was out of
        reach at startup)."""
        return self._routes.get(config.name) or seed_routes(config)

    async def refresh(self) -> None:
        """Reload every model's routes if the global version moved since the last look, one
        reload at a time: a PUT's own reload and the poll ran at once, and a poll that had read
        the routes before the change landed wrote them back over it (requests after the 200
        went by the old split until the next poll). A failed one forgets the version applied:
        Redis may be restarting without its data, and the counter other producers' seeding and
        changes bring back to that number read as "nothing changed" (the lost routes served
        until the next change)."""
        async with self._reloading:
            try:
                await self._reload()
            except Exception:
                self._version = -1
                raise

    async def _reload(self) -> None:
        """Models without stored routes are seeded, then everything is read again at once:
        returning there left every model on config.yaml's split until the next poll, and a
        producer just started sent its first requests by it, not by the live routes."""
        version = await self.store.version()
        if version == self._version:
            return
        names = [config.name for config in self.repository]
        routes = await self.store.get_many(names)
        missing = [config for config in self.repository if config.name not in routes]
        if missing:
            for config in missing:
                await self.store.seed(config.name, seed_routes(config))
            version = await self.store.version()  # before the routes: a later change reloads
            routes = await self.store.get_many(names)
        if self._version >= 0:
            log.info("routes reloaded at version %d", version)
        self._routes = {c.name: self._served(c, routes[c.name]) for c in self.repository}
        self._version = version
        ROUTES_VERSION.set(version)

    def _served(self, config: ModelConfig, stored: Routes) -> Routes:
        """The stored routes as they can serve the model (see served_routes), with a warning
        the first time they differ, not at every reload."""
        routes, why = served_routes(stored, config)
        if why is not None and self._warned.get(config.name) != (stored.version, why):
            log.warning("live routes of %s (version %d): %s", config.name, stored.version, why)
        self._warned[config.name] = (stored.version, why)
        return routes
