"""The experiments logic without HTTP: every variant of a model over a window, from the counters
workers and producers keep in Redis, tested against the baseline."""

from __future__ import annotations

import asyncio
from typing import Any

from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError
from producer_api.experiments.statistics import MIN_SAMPLES, summary, versus
from producer_api.models.serving import model_of
from producer_api.state import ProducerState
from shared.redis_clock import CLOCK
from shared.routing import Routes
from shared.stats_window import window_span_s
from shared.variant_stats import Window


class ExperimentsService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.principal = principal

    async def report(
        self, model: str, window_s: float, baseline: str | None, min_samples: int
    ) -> dict[str, Any]:
        config = model_of(self.state, self.principal, model)
        baseline = baseline or config.default_variant
        if baseline not in config.variants:
            raise ConveyorError(
                422, "unknown_variant", f"model {model} has no variant {baseline!r}"
            )
        traffic = self.state.traffic
        routes = traffic.routes.of(config)
        now = CLOCK.now()  # the buckets' clock: the workers' and producers' that file them
        since = now - window_s
        windows = await traffic.stats.window(model, config.variants, since, now)
        # off the event loop: the first comparison imports scipy.stats (about 1 s on 2 cores),
        # and a test on many samples is numpy work; every other request waits on the loop
        variants = await asyncio.to_thread(compared, windows, baseline, routes, min_samples)
        # the span measured: whole buckets, so up to BUCKET_S more than asked for
        span_s = round(window_span_s(since, now), 3)
        return {
            "model": model,
            "window_s": span_s,
            "baseline": baseline,
            "min_samples": min_samples,
            "variants": variants,
        }


def compared(
    windows: dict[str, Window], baseline: str, routes: Routes, min_samples: int = MIN_SAMPLES
) -> list[dict[str, Any]]:
    """Each variant's summary, role and weight, and its tests against the baseline's window."""
    return [
        {
            "variant": name,
            "role": _role(name, baseline, routes),
            "weight": routes.weights.get(name, 0.0),
            "shadow_rate": routes.shadows.get(name),
            **summary(window),
            "vs_baseline": None
            if name == baseline
            else versus(baseline, windows[baseline], window, min_samples),
        }
        for name, window in windows.items()
    ]


def _role(name: str, baseline: str, routes: Routes) -> str:
    if name == baseline:
        return "baseline"
    return "shadow" if name in routes.shadows else "variant"
