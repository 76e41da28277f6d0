"""The routes logic without HTTP: read a model's live routes with their change log, and replace
them after checking them against the model (nothing is stored unless they are valid)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError
from producer_api.models.serving import model_of
from producer_api.routes.protocol import RoutesBody
from producer_api.state import ProducerState
from shared.model_repository import ModelConfig
from shared.route_store import VersionConflict
from shared.routing import InvalidRoutes, Routes, UnknownVariant, seed_routes


class RoutesService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.principal = principal
        self.store = state.traffic.route_store

    def config(self, model: str) -> ModelConfig:
        return model_of(self.state, self.principal, model)

    async def show(self, model: str, history: int = 20) -> dict[str, Any]:
        """The routes producers serve (the stored ones as they fit config.yaml now), with why
        they differ from the stored ones, if they do, a warning per variant they feed that no
        worker serves, and the change log."""
        config = self.config(model)
        routes, adjusted = await self.store.served(config)
        changes = [asdict(change) for change in await self.store.history(model, history)]
        unserved = await self.state.traffic.unserved(model, routes.fed())
        return {
            "model": model,
            "version": routes.version,
            **routes.document(),
            "adjusted": adjusted,
            "warnings": [
                f"no worker serves {model}:{name} now: its jobs wait in its queue until one does"
                for name in unserved
            ],
            "history": changes,
        }

    async def replace(self, model: str, body: RoutesBody) -> dict[str, Any]:
        config = self.config(model)
        routes = Routes(body.weights, body.shadows, body.sticky_by)
        try:
            routes.check(config)
        except UnknownVariant as exc:
            raise ConveyorError(422, "unknown_variant", str(exc)) from None
        except InvalidRoutes as exc:
            raise ConveyorError(422, "invalid_routes", str(exc)) from None
        return await self._store(model, routes, body.expected_version)

    async def reset(self, model: str, expected_version: int | None) -> dict[str, Any]:
        """Put config.yaml's routes back as the next version: a rollback to the deployed
        config, versioned, logged and applied by every producer as a replace is."""
        return await self._store(model, seed_routes(self.config(model)), expected_version)

    async def _store(self, model: str, routes: Routes, expected: int | None) -> dict[str, Any]:
        by = f"key:{self.principal.key_id} ({self.principal.tenant})"
        try:
            await self.store.put(model, routes, by, expected)
        except VersionConflict as exc:
            raise ConveyorError(
                409, "conflict", f"routes of {model} changed meanwhile: now version {exc.current}"
            ) from None
        await self.state.traffic.refresh_routes()
        return await self.show(model)
