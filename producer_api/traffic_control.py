"""Everything a producer holds for live traffic (issue 13): the live routes every submit reads,
shadow copies, per-variant statistics, canaries, and the one background task that refreshes the
routes and, while this producer holds the traffic lease, drives canaries and compares shadow
pairs. Built once in the app's lifespan; state lives in Redis, so any producer can lead."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis

from producer_api.canary.controller import CanaryController
from producer_api.periodic import Periodic
from producer_api.routes.live_routes import POLL_S, LiveRoutes
from producer_api.routes.shadowing import ShadowComparisons, ShadowCopies
from shared.canary_store import CanaryStore
from shared.codec import RequestEntry
from shared.job_store import JobStore
from shared.keys import Keys
from shared.leader_lock import LeaderLock
from shared.metrics import ROUTE_WEIGHT
from shared.model_repository import ModelConfig, ModelRepository
from shared.redis_client import OUT_OF_REACH
from shared.route_store import RouteStore
from shared.routing import choose_variant
from shared.settings import Settings
from shared.shadow_pairs import ShadowPairs
from shared.variant_stats import VariantStats
from shared.webhook_events import WebhookDispatcher
from shared.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)

LEADER_LOOK_S = 0.5
LEASE_MS = 5_000


@dataclass(slots=True)
class TrafficControl:
    repository: ModelRepository
    route_store: RouteStore
    routes: LiveRoutes
    stats: VariantStats
    shadow_pairs: ShadowPairs
    shadows: ShadowCopies
    comparisons: ShadowComparisons
    canaries: CanaryStore
    controller: CanaryController
    lease: LeaderLock
    workers: WorkerRegistry
    loops: tuple[Periodic, ...] = ()

    @classmethod
    def build(
        cls,
        client: aioredis.Redis,
        keys: Keys,
        settings: Settings,
        repository: ModelRepository,
        job_store: JobStore,
        webhooks: WebhookDispatcher,
    ) -> TrafficControl:
        route_store = RouteStore(client, keys)
        stats = VariantStats(client, keys)
        pairs = ShadowPairs(client, keys, settings.result_ttl_s)
        canaries = CanaryStore(client, keys)
        traffic = cls(
            repository=repository,
            route_store=route_store,
            routes=LiveRoutes(route_store, repository),
            stats=stats,
            shadow_pairs=pairs,
            shadows=ShadowCopies(job_store, pairs, keys),
            comparisons=ShadowComparisons(pairs, job_store, stats, repository, LEADER_LOOK_S),
            canaries=canaries,
            controller=CanaryController(canaries, route_store, stats, repository, webhooks),
            lease=LeaderLock(client, keys.traffic_leader, settings.instance_id, LEASE_MS),
            workers=WorkerRegistry(client, keys),
        )
        traffic.loops = (
            Periodic("live-routes", POLL_S, traffic.refresh_routes),
            Periodic("traffic-leader", LEADER_LOOK_S, traffic.lead),
        )
        return traffic

    def route(
        self, config: ModelConfig, explicit: str | None, routing_key: str | None, tenant: str
    ) -> str:
        """The variant of a request, by the live routes (raises UnknownVariant)."""
        routes = self.routes.of(config)
        sticky = tenant if routes.sticky_by == "tenant" else routing_key
        return choose_variant(config, explicit, sticky, routes)

    def shadow(self, config: ModelConfig, entry: RequestEntry, variant: str) -> None:
        """Copy an accepted online request to the model's shadows (sampled, in the background)."""
        self.shadows.copy(config, self.routes.of(config), entry, variant)

    async def unserved(self, model: str, variants: list[str]) -> list[str]:
        """Those of `variants` of `model` no worker serves or warms up now, by heartbeat: routes
        or a canary that send them jobs leave those waiting in a queue nobody reads (a canary's
        step rolls back only after `max_step_s`), so the operator is told at once."""
        if not variants:
            return []
        beats = await self.workers.live()
        served = {p for beat in beats if beat.state != "draining" for p in beat.models}
        return [name for name in variants if f"{model}:{name}" not in served]

    async def refresh_routes(self) -> None:
        await self.routes.refresh()
        for config in self.repository:
            weights = self.routes.of(config).weights
            for variant in config.variants:  # one the routes no longer name serves 0 %
                ROUTE_WEIGHT.labels(config.name, variant).set(weights.get(variant, 0.0))

    async def lead(self) -> None:
        """Canaries and shadow comparisons, on the one producer that holds the lease."""
        try:
            leading = await self.lease.hold()
        except Exception:  # unsure it leads: it must not export a canary's gauges as if it did
            self.controller.step_down()
            raise
        if leading:
            await self.controller.look(self.lease)
            await self.comparisons.look()
        else:
            self.controller.step_down()

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    async def stop(self) -> None:
        """Stop the loops, then give up the lease if held: another producer leads at its next
        look, not a lease later (Redis out of reach: the lease lapses as it would have)."""
        for loop in self.loops:
            await loop.stop()
        await self.shadows.stop()
        with contextlib.suppress(*OUT_OF_REACH):
            await self.lease.release()
