"""The canary logic without HTTP: start a rollout (checked against the model and its routes),
show it with its decisions, abort it (back to 0 %). The leader's controller does the rest."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from redis.exceptions import LockError

from producer_api.auth.principal import Principal
from producer_api.canary.protocol import CanaryStart
from producer_api.errors import ConveyorError
from producer_api.models.serving import model_of
from producer_api.state import ProducerState
from shared.canary_steps import default_max_step_s, min_requests_refusal, steps_refusal
from shared.canary_store import Canary
from shared.model_repository import ModelConfig
from shared.routing import InvalidRoutes, UnknownVariant, serving_variant
from shared.webhook_events import refusal


class CanaryService:
    def __init__(self, state: ProducerState, principal: Principal) -> None:
        self.state = state
        self.principal = principal
        self.store = state.traffic.canaries
        self.controller = state.traffic.controller

    def config(self, model: str) -> ModelConfig:
        return model_of(self.state, self.principal, model)

    async def start(self, model: str, body: CanaryStart) -> dict[str, Any]:
        config = self.config(model)
        baseline = body.baseline or config.default_variant
        self._check(config, body, baseline)
        await self._check_none_running(model)
        await self._check_routes(config, body)
        canary = Canary(
            model=model,
            variant=body.variant,
            baseline=baseline,
            steps=body.steps,
            interval_s=body.interval_s,
            max_error_rate=body.max_error_rate,
            max_p99_ms=body.max_p99_ms,
            min_requests=body.min_requests,
            max_step_s=body.max_step_s or 0.0,  # 0: the default bound
            webhook=body.webhook or "",
            by=f"key:{self.principal.key_id} ({self.principal.tenant})",
        )
        async with _in_turn(model):
            started = await self.controller.start(canary)
        if not started:
            raise _running(model)
        return await self.show(model)

    def _check(self, config: ModelConfig, body: CanaryStart, baseline: str) -> None:
        """Refuse a body the canary cannot start from, with a 422 naming the field: a typo in
        the baseline was told as "model ab has no variant ...", as if it were in the variant."""
        for field, name in (("variant", body.variant), ("baseline", baseline)):
            try:
                serving_variant(config, name)  # as the live routes refuse it
            except UnknownVariant as exc:
                raise ConveyorError(422, "unknown_variant", f"{field}: {exc}") from None
            except InvalidRoutes as exc:
                raise ConveyorError(422, "invalid_request", f"{field}: {exc}") from None
        if body.variant == baseline:
            message = (
                f"baseline: the canary and its baseline are one, {baseline}"
                " (the model's default variant unless `baseline` names another)"
            )
            raise ConveyorError(422, "invalid_request", message)
        if (why := steps_refusal(body.steps)) is not None:
            raise ConveyorError(422, "invalid_request", f"steps: {why}")
        max_step_s = body.max_step_s or default_max_step_s(body.interval_s)
        if (why := min_requests_refusal(body.min_requests, max_step_s)) is not None:
            raise ConveyorError(422, "invalid_request", f"min_requests: {why}")
        if body.webhook and (why := refusal(body.webhook, self.state.settings)):
            raise ConveyorError(422, "invalid_request", why)

    async def _check_none_running(self, model: str) -> None:
        """A 409 that says a canary runs, before the routes are judged: they are the running
        canary's, and a second start of its variant was told it "already serves 25 %... is it
        the baseline?". The start's own script still decides a race between two starts."""
        running = await self.store.get(model)
        if running is not None and running.state == "running":
            raise _running(model)

    async def _check_routes(self, config: ModelConfig, body: CanaryStart) -> None:
        """Refuse a canary the live routes contradict (a variant and baseline given swapped):
        its first step would take a variant serving everything down to the first step's share,
        and a rollback would hand all traffic to a baseline that had none."""
        routes, _ = await self.state.traffic.route_store.served(config)
        held = routes.weights.get(body.variant, 0.0)
        if held > body.steps[0] or not routes.served_besides(body.variant):
            message = (
                f"variant {body.variant} already serves {held:g} % of model {config.name}'s"
                f" traffic (the first step gives it {body.steps[0]:g} %): is it the baseline?"
            )
            raise ConveyorError(409, "conflict", message)

    async def show(self, model: str, limit: int = 100) -> dict[str, Any]:
        self.config(model)
        canary = await self.store.get(model)
        events = await self.store.events(model, limit)
        return {
            "canary": asdict(canary) if canary else None,
            "warnings": await self._warnings(canary),
            "events": events,
        }

    async def _warnings(self, canary: Canary | None) -> list[str]:
        """A running canary whose variant no worker serves sends its step's share of users into
        a queue nobody reads until the step rolls back, `max_step_s` later: say so at once."""
        if canary is None or canary.state != "running":
            return []
        unserved = await self.state.traffic.unserved(canary.model, [canary.variant])
        return [
            f"no worker serves {canary.model}:{name} now: the canary's share of requests waits in"
            f" its queue, and a step short of min_requests rolls back after {canary.max_step_s:g} s"
            for name in unserved
        ]

    async def abort(self, model: str) -> dict[str, Any]:
        self.config(model)
        reason = f"aborted by key:{self.principal.key_id} at {time.time():.0f}"
        async with _in_turn(model):
            aborted = await self.controller.abort(model, reason)
        if not aborted:
            raise ConveyorError(409, "conflict", f"model {model} has no canary running")
        return await self.show(model)


def _running(model: str) -> ConveyorError:
    return ConveyorError(409, "conflict", f"model {model} has a canary running already")


@asynccontextmanager
async def _in_turn(model: str) -> AsyncIterator[None]:
    """A start or an abort that could not take its turn (a decision held the lock for
    TURN_WAIT_S) is a 409 to retry."""
    try:
        yield
    except LockError as exc:
        message = f"the canary of model {model} is being decided; try again"
        raise ConveyorError(409, "conflict", message, {"Retry-After": "1"}) from exc
