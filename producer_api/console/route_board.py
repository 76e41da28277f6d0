"""What the console's Routes page shows per model: the live routes this producer serves (its copy,
refreshed every 100 ms, so no Redis read), the model's canary with its latest decision, and each
shadow variant's comparisons over the last hour, as `GET /v1/experiments` reports them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from producer_api.experiments.statistics import summary
from producer_api.traffic_control import TrafficControl
from shared.redis_clock import CLOCK

SHADOW_WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class RouteRow:
    model: str
    version: int
    sticky_by: str
    weights: dict[str, float]
    shadows: list[dict[str, Any]]  # variant, rate and its comparisons (None before any pair)
    canary: dict[str, Any] | None
    decision: dict[str, Any] | None  # the canary's latest event


async def route_board(traffic: TrafficControl, shown: Callable[[str], bool]) -> list[RouteRow]:
    """A row per model that `shown` accepts (the others' routes and stats are not read)."""
    now = CLOCK.now()  # the stats buckets' clock
    rows = []
    for config in traffic.repository:
        if not shown(config.name):
            continue
        routes = traffic.routes.of(config)
        # counters only: a shadow's comparisons are counted, its latency samples never shown
        since = now - SHADOW_WINDOW_S
        windows = await traffic.stats.window(config.name, routes.shadows, since, samples=False)
        shadows = [
            {"variant": name, "rate": rate, "compared": summary(windows[name])["shadow"]}
            for name, rate in routes.shadows.items()
        ]
        canary = await traffic.canaries.get(config.name)
        events = await traffic.canaries.events(config.name, 1) if canary else []
        rows.append(
            RouteRow(
                model=config.name,
                version=routes.version,
                sticky_by=routes.sticky_by,
                weights=routes.weights,
                shadows=shadows,
                canary=asdict(canary) if canary else None,
                decision=events[-1] if events else None,
            )
        )
    return rows
