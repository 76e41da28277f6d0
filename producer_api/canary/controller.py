"""Drives running canaries, one decision per look (the traffic leader looks every LOOK_S): the
first step at start; the next step once the step has lasted `interval_s` with `min_requests` seen
(and as many online jobs, so its p99 was judged) and the bounds held; a rollback to 0 % the
moment `min_requests` are seen and a bound is broken (error rate above the baseline's by more
than `max_error_rate`, or the p99 of at least `min_requests` online jobs above `max_p99_ms`);
completion after a healthy interval at the last step. A baseline short of `min_requests` in the
step (at 100 % it gets no traffic) is taken over the whole canary, and if still short, the
canary's error rate is held to `max_error_rate` itself. Every decision is an event with its
numbers, and a `model.canary.*` webhook when the canary has one, owed from the decision's save
until the broker has it (a look hands over what a producer that died in between left; a broker
that refuses is asked again after a back-off, not at every look). A step still short of
`min_requests` (or of online jobs) after `max_step_s` rolls back (its variant's workers may
never take a job); live routes that no longer give the variant the canary's weight (an operator
changed them) abort it, leaving them as they are, and so does a config.yaml that no longer
serves its variant or baseline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextvars import ContextVar
from typing import Any

import numpy as np
from redis.exceptions import LockError, RedisError

from producer_api.redis_outage import RedisOutage
from shared.canary_steps import WEIGHT_SLACK
from shared.canary_store import (
    Canary,
    CanaryState,
    CanaryStore,
    NotLeading,
    OwedWebhook,
    stamp,
)
from shared.leader_lock import LeaderLock
from shared.metrics import CANARY_STATE, CANARY_WEIGHT, hide
from shared.model_repository import ModelConfig, ModelRepository
from shared.redis_clock import CLOCK
from shared.route_store import RouteStore, VersionConflict
from shared.routing import InvalidRoutes, Routes, UnknownVariant, serving_variant
from shared.stats_window import first_bucket_after
from shared.variant_stats import VariantStats, Window
from shared.webhook_events import WebhookDispatcher, event
from shared.webhook_signing import OPERATOR

log = logging.getLogger(__name__)

STATES: tuple[CanaryState, ...] = ("running", "completed", "rolled_back", "aborted")
TURN_WAIT_S = 5.0  # a decision holds the model's canary lock for milliseconds
ABORT_TRIES = 3  # an abort whose routes write meets a concurrent change reads them again
LONGEST_LOOK_S = 6 * 3600.0  # of a step's window read per look, unless its interval is longer
UNJUDGED_P99 = "its p99 was never judged (Batch API items have none of their own)"
RATE_DIGITS = 6  # of an error rate, as a decision's numbers show it
RATIO_SLACK = 1e-9  # of the others' shares: the same ratios, but for the scaling's rounding
# The traffic lease the look under way decides under: its writes are the leader's, fenced by
# it. Unset in a start's or an abort's task, whose writes any producer may make.
_LEASE: ContextVar[LeaderLock | None] = ContextVar("traffic_lease", default=None)


def numbers(window: Window, least: int = 1) -> dict[str, Any]:
    """What a decision is based on, for one variant: every job's outcome, and the p99 of its
    online jobs (a Batch API item follows the live routes into the variant's bulk lane, where
    it waits behind online work by design, for minutes: a few made a healthy canary's p99
    breach `max_p99_ms`), None below `least` of them: the canary's is judged on `min_requests`
    (39 items and one slow online job rolled a healthy canary back on a p99 of that one job),
    the baseline's only shown."""
    totals = [s.total_ms for s in window.samples if not s.bulk]
    p99 = float(np.percentile(totals, 99)) if totals and len(totals) >= least else None
    return {
        "requests": window.requests,
        "errors": window.errors,
        "error_rate": round(window.error_rate, RATE_DIGITS),
        "p99_ms": None if p99 is None else round(p99, 3),
    }


def breach(canary: Canary, mine: dict[str, Any], base: dict[str, Any]) -> str | None:
    """Why the canary must roll back, or None while it stays within its bounds. The excess is
    rounded as the rates are: unrounded, 7 % over 6 % was 0.010000000000000009, more than a
    `max_error_rate` of 0.01, and rolled back while 2 % over 1 % held."""
    reference, against = error_reference(canary, base)
    if round(mine["error_rate"] - reference, RATE_DIGITS) > canary.max_error_rate:
        return (
            f"error rate {mine['error_rate']:.4f} exceeds {against}"
            f" by more than {canary.max_error_rate}"
        )
    if mine["p99_ms"] is not None and mine["p99_ms"] > canary.max_p99_ms:
        return f"p99 {mine['p99_ms']:.1f} ms is above {canary.max_p99_ms} ms"
    return None


def error_reference(canary: Canary, base: dict[str, Any]) -> tuple[float, str]:
    """The error rate the canary's may exceed by `max_error_rate`, and its name in a reason:
    the baseline's, or 0 when the baseline is short of `min_requests` (a few leftover jobs,
    one failure among 14, would excuse a canary failing 8 %)."""
    if base["requests"] >= canary.min_requests:
        return base["error_rate"], f"the baseline's {base['error_rate']:.4f}"
    return 0.0, (
        f"0 (the baseline's {base['requests']} requests are fewer than"
        f" min_requests {canary.min_requests})"
    )


def since(canary: Canary, began: float) -> float:
    """Where a look's window from `began` starts: at the first whole bucket after it (the one
    a step began in holds the last step's requests), never more than max(interval,
    LONGEST_LOOK_S) back, so a step long past its interval (short of min_requests) is judged
    on its latest part, not on a window that grows without end."""
    longest = max(canary.interval_s, LONGEST_LOOK_S)
    return max(first_bucket_after(began), CLOCK.now() - longest)


def starved(canary: Canary, short: str, hint: str) -> str | None:
    """Why a step short of `min_requests` (`short`: of what, `hint`: the likely cause) must roll
    back: it has been so past `max_step_s` (its variant's workers may never take a job: the
    jobs of its share wait in its lane, and nothing is ever counted); None while it may wait."""
    waited = CLOCK.now() - canary.step_started_at
    if waited <= canary.max_step_s:
        return None
    return (
        f"{short} in {waited:.0f} s at {canary.weight:g} %, fewer than min_requests"
        f" {canary.min_requests} within max_step_s {canary.max_step_s:g}: {hint}"
    )


def show(canary: Canary) -> None:
    CANARY_WEIGHT.labels(canary.model, canary.variant).set(canary.weight)
    for state in STATES:
        CANARY_STATE.labels(canary.model, canary.variant, state).set(canary.state == state)


class CanaryController:
    def __init__(
        self,
        store: CanaryStore,
        routes: RouteStore,
        stats: VariantStats,
        repository: ModelRepository,
        webhooks: WebhookDispatcher,
    ) -> None:
        self.store = store
        self.routes = routes
        self.stats = stats
        self.repository = repository
        self.webhooks = webhooks
        self._shown: dict[str, str] = {}  # model → canary variant this leader shows in gauges
        # The broker's refusals of owed webhooks, and when it is asked again (monotonic): each
        # look (every 0.5 s) asked it again, a refused publish holding the look 0.6 s.
        self._broker = RedisOutage("canary webhooks")
        self._hand_over_after = 0.0

    async def look(self, lease: LeaderLock | None = None) -> None:
        """Decide for each running canary under the traffic `lease` (None: unfenced), then show
        its state in the gauges. A leader paused past its lease while another took it has each
        write refused (NotLeading): it stops here and steps down, the new leader decides."""
        token = _LEASE.set(lease)
        try:
            await self._look_all()
        except NotLeading as exc:
            log.warning(
                "lost the traffic lease deciding the canary of %s; left to the new leader", exc
            )
            self.step_down()
        finally:
            _LEASE.reset(token)

    async def _look_all(self) -> None:
        """Only the leader sets the gauges, and it shows a canary it saw running until it
        ended, even when another producer ended it (an abort), so no producer keeps a stale
        `running`."""
        active = await self.store.active()
        shown: dict[str, str] = {}
        for model in sorted({*active, *self._shown}):
            lock = self.store.lock(model, wait_s=None)
            if not await lock.acquire():  # a start or an abort is under way: look next time
                if model in self._shown:
                    shown[model] = self._shown[model]
                continue
            try:
                if variant := await self._look_at(model, model in active):
                    shown[model] = variant
            except (RedisError, NotLeading):
                raise
            except Exception:  # one model's fault used to stop every other model's canary
                log.exception("canary of %s: the decision failed; the next look retries", model)
                if model in self._shown:
                    shown[model] = self._shown[model]
            finally:
                with contextlib.suppress(LockError):  # expired under a decision past LOCK_S
                    await lock.release()
        self._shown = shown

    async def _look_at(self, model: str, active: bool) -> str | None:
        """Hand over the webhooks its canary owes (a producer died before it did), decide the
        canary and show it; returns its variant while it is to be shown."""
        canary, owed = await self.store.owing(model)
        if canary is None:  # gone with a Redis restarted without its data: `running` no more
            self._hide(model)
            return None
        for webhook in owed:
            if not await self._hand_over(model, webhook):
                break  # the broker refuses: the next look tries again
        try:
            if canary.state == "running":
                await self.decide(canary)
            show(canary)
        except VersionConflict:
            log.info("routes of %s changed while its canary moved; deciding again", model)
        return canary.variant if active else None

    async def start(self, canary: Canary) -> bool:
        """Store a new running canary with its `started` event in one step, then log and
        webhook it; False if the model has one running. Saved by a second call, a Redis error
        between the two answered 500 for a canary that ran without the event. In its turn, so
        the leader's first step never comes before the `started` event."""
        async with self.store.lock(canary.model, wait_s=TURN_WAIT_S):
            record = _record(canary, "started", None, {})
            owed = owed_webhook(canary, "started", record)
            if not await self.store.start(canary, record, owed):  # with its event, in one step
                return False
            await self._tell(canary, "started", owed)
            return True

    async def abort(self, model: str, reason: str) -> bool:
        """End the model's running canary at 0 %; False if none is running. It waits for a
        decision under way, which would otherwise write its step over the abort."""
        async with self.store.lock(model, wait_s=TURN_WAIT_S):
            canary = await self.store.get(model)
            if canary is None or canary.state != "running":
                return False
            for tries_left in reversed(range(ABORT_TRIES)):
                try:
                    await self.end(canary, "aborted", 0.0, reason, {})
                    break
                except VersionConflict:  # an operator's routes change just landed: read again
                    if not tries_left:
                        raise
            return True

    def step_down(self) -> None:
        """No longer the leader: stop showing canaries, so only the leader's gauges count."""
        for model in self._shown:
            self._hide(model)
        self._shown = {}

    def _hide(self, model: str) -> None:
        """Remove the gauges of the model's canary this leader shows, if it shows one."""
        if (variant := self._shown.get(model)) is None:
            return
        hide(CANARY_WEIGHT, model, variant)
        for state in STATES:
            hide(CANARY_STATE, model, variant, state)

    async def decide(self, canary: Canary) -> None:
        if reason := self.unservable(canary) or await self.unrouted(canary):
            await self.end(canary, "aborted", canary.weight, reason, {})
            return
        if canary.step < 0:
            await self.move(canary, 0, "step", None, {})
            return
        read = await self.overridden(canary)
        if read is None:
            return
        began = since(canary, canary.step_started_at)
        seen = await self.step_numbers(canary, began)
        if seen["canary"]["requests"] < canary.min_requests:
            short = f"{seen['canary']['requests']} requests"
            if reason := starved(canary, short, "do its workers take jobs?"):
                seen = await self.timed(canary, seen, began)
                await self.end(canary, "rolled_back", 0.0, reason, seen, read)
            return
        whole_canary = seen["baseline"]["requests"] < canary.min_requests
        if whole_canary:  # at 100 % it gets no traffic
            seen["baseline"] = await self.baseline_so_far(canary)
        reason = breach(canary, seen["canary"], seen["baseline"])
        if reason is None and CLOCK.now() - canary.step_started_at < canary.interval_s:
            return
        if reason is None and seen["canary"]["p99_ms"] is None:
            # Mostly Batch API items (no p99 of their own): its latency is not judged yet, and
            # a step does not pass unjudged (Flagger and Argo Rollouts wait for samples, then
            # fail as inconclusive); it waits for min_requests online jobs up to max_step_s.
            reason = starved(canary, "online jobs", UNJUDGED_P99)
            if reason is None:
                return
        if not whole_canary:
            seen = await self.timed(canary, seen, began)
        if reason:
            await self.end(canary, "rolled_back", 0.0, reason, seen, read)
        elif canary.step + 1 < len(canary.steps):
            await self.move(canary, canary.step + 1, "step", "bounds held", seen, read)
        else:
            await self.end(canary, "completed", canary.weight, "bounds held", seen, read)

    def unservable(self, canary: Canary) -> str | None:
        """Why the canary cannot go on: config.yaml (a redeploy) no longer has its variant or its
        baseline as a serving variant. Producers then ignore stored routes that weigh it and
        serve config.yaml's, and the canary stepped on, even `completed`, on counts of a variant
        nobody was routed to. It ends leaving the routes as they are, as an operator's change
        does (`routes reset` puts config.yaml's back). The leader's config.yaml decides: a
        rollout that adds the variant, not yet at the leader, ends it too (the reason says so).
        None while both serve; none for a model the repository does not hold."""
        config = self.repository.get(canary.model)
        if config is None:
            return None
        for role, name in (("variant", canary.variant), ("baseline", canary.baseline)):
            try:
                serving_variant(config, name)
            except (UnknownVariant, InvalidRoutes) as exc:
                return f"its {role} cannot serve by the leading producer's config.yaml: {exc}"
        return None

    async def step_numbers(self, canary: Canary, began: float) -> dict[str, dict[str, Any]]:
        """Both variants' numbers over the step, the baseline's without its p99: `breach`
        reads its error rate alone, and every look (twice a second) read up to WINDOW_SAMPLES
        of its samples. Its p99 is read for a decision's event only (`timed`)."""
        canary_window, baseline_window = await asyncio.gather(
            self.stats.window(canary.model, [canary.variant], began),
            self.stats.window(canary.model, [canary.baseline], began, samples=False),
        )
        return {
            "canary": numbers(canary_window[canary.variant], canary.min_requests),
            "baseline": numbers(baseline_window[canary.baseline]),
        }

    async def timed(self, canary: Canary, seen: dict[str, Any], began: float) -> dict[str, Any]:
        """`seen` with the baseline's p99 over the step, for the event of a decision made on
        its counters."""
        window = await self.stats.window(canary.model, [canary.baseline], began)
        p99_ms = numbers(window[canary.baseline])["p99_ms"]
        return seen | {"baseline": seen["baseline"] | {"p99_ms": p99_ms}}

    async def overridden(self, canary: Canary) -> Routes | None:
        """The live routes, judged to give the canary's variant its weight; None once it
        aborted the canary because they don't: someone changed them during the step, and its
        next step would write over their change. The canary takes the live weight, so the abort
        leaves their routes as they are. A decision writes its step conditional on the routes
        returned, so a change landing while it reads its windows fails that write."""
        live = await self.live_routes(canary)
        weight = live.weights.get(canary.variant, 0.0)  # Routes hold no -0.0 (shared/routing)
        if abs(weight - canary.weight) <= WEIGHT_SLACK:
            return live
        if (written_as := await self._own_write(canary, live.version, weight)) is not None:
            await self._resume(canary, live, written_as)
            return None
        reason = (
            f"routes changed outside the canary (version {live.version}): {canary.variant}"
            f" has {weight:g} %, not its step's {canary.weight:g} %"
        )
        canary.weight = weight
        await self.end(canary, "aborted", weight, reason, {})
        return None

    async def _own_write(self, canary: Canary, version: int, weight: float) -> CanaryState | None:
        """Whether the live routes, giving the variant `weight`, are the canary's own last
        write, its record's save lost (a Redis error, a leader that died between the two): no
        one else changed them. Its write must give that weight too: stored routes a redeploy
        voided are served as config.yaml's at their version, and were taken for a rollback.
        Returns what wrote them, `aborted` for an abort's and `running` for a step's or a
        rollback's; None when someone else did."""
        last = await self.routes.history(canary.model, 1)
        if not last or last[-1].version != version:
            return None
        authors: dict[str, CanaryState] = {_author(canary, s): s for s in ("running", "aborted")}
        written_as = authors.get(last[-1].by)
        written = Routes.of(last[-1].new).weights.get(canary.variant, 0.0)
        return written_as if abs(written - weight) <= WEIGHT_SLACK else None

    async def _resume(self, canary: Canary, live: Routes, written_as: CanaryState) -> None:
        """Take up the step, rollback or abort the canary's routes, `live`, already show (an
        abort's are told apart by their author: it was recorded `rolled_back`), and announce
        it: the lost save was before its announcement, so no event or webhook told of it."""
        weight = live.weights.get(canary.variant, 0.0)
        if written_as == "aborted" or weight <= WEIGHT_SLACK:
            canary.weight = weight  # at 0 % already: `end` writes no routes again
            if written_as == "aborted":
                await self.end(canary, "aborted", 0.0, "its abort's record was lost", {}, live)
            else:
                reason = "its rollback's record was lost"
                await self.end(canary, "rolled_back", 0.0, reason, {}, live)
            return
        steps = [n for n, share in enumerate(canary.steps) if abs(share - weight) <= WEIGHT_SLACK]
        canary.step = steps[0] if steps else canary.step
        canary.weight, canary.step_started_at = weight, CLOCK.now()
        await self.announce(canary, "step", "taken up: its record was lost", {})

    async def baseline_so_far(self, canary: Canary) -> dict[str, Any]:
        """The baseline's numbers over the whole canary (its earlier steps gave it traffic):
        the reference of a step that gives it too little. Counters only: `breach` reads its
        error rate, never its latency (its samples were up to 100,000 rows a look)."""
        started = since(canary, canary.started_at)
        window = await self.stats.window(canary.model, [canary.baseline], started, samples=False)
        return numbers(window[canary.baseline])

    async def move(
        self,
        canary: Canary,
        step: int,
        kind: str,
        reason: str | None,
        seen: dict[str, Any],
        read: Routes | None = None,
    ) -> None:
        """Take `step`, its routes built from `read` (the routes judged; None: read them now)."""
        canary.step = step
        canary.weight = canary.steps[step]
        canary.step_started_at = CLOCK.now()
        await self.set_weight(canary, canary.weight, read)
        await self.announce(canary, kind, reason, seen)

    async def end(
        self,
        canary: Canary,
        state: CanaryState,
        weight: float,
        reason: str | None,
        seen: dict[str, Any],
        read: Routes | None = None,
    ) -> None:
        """Finish the rollout; a rollback or an abort puts the canary back to 0 % first, from
        `read` as `move` does."""
        if weight != canary.weight:
            await self.set_weight(canary, weight, read, state)
        canary.state, canary.weight = state, weight
        await self.announce(canary, state, reason, seen)

    async def unrouted(self, canary: Canary) -> str | None:
        """Why the canary cannot go on where no routes are left to step: its model gone from
        config.yaml, and no stored routes for it either (`routes reset`, a Redis restarted
        without its data). Every look failed on them, twice a second, for ever; the canary's
        model answered 404, so no abort could end it. None while either holds the model."""
        if self.repository.get(canary.model) is not None:
            return None
        if await self.routes.get_many([canary.model]):
            return None
        return f"model {canary.model} is neither in the model repository nor has stored routes"

    async def live_routes(self, canary: Canary) -> Routes:
        """The routes producers serve the model with: stored ones they ignore (weight on a
        variant a redeploy removed) gave way to config.yaml's, and a step scaled from them
        stayed ignored, its share never served, until the step starved and rolled back."""
        config = self.repository.get(canary.model)
        if config is None:  # a model no producer here serves: its stored routes as they are
            return (await self.routes.get_many([canary.model]))[canary.model]
        routes, _ = await self.routes.served(config)
        return routes

    async def set_weight(
        self,
        canary: Canary,
        percent: float,
        read: Routes | None,
        state: CanaryState = "running",
    ) -> None:
        """Give the variant `percent` of the routes `read`, those a decision judged (None where
        none was: the first step, an abort), conditional on their version: an operator's change
        made since wins (VersionConflict), and the next look aborts the canary on it. Read
        again here, it was scaled from and written over. A look's write is fenced by its lease
        in PUT's own step (NotLeading): a check before it left a pause between the two open."""
        current = read if read is not None else await self.live_routes(canary)
        canary.others = _handed_back(canary.others, current.served_besides(canary.variant))
        held = self._servable(canary.model, canary.others) or {canary.baseline: 1}
        routes = _restored(current.with_share(canary.variant, percent, held), held)
        await self.routes.put(
            canary.model, routes, _author(canary, state), current.version, lease=_LEASE.get()
        )

    def _servable(self, model: str, weights: dict[str, float]) -> dict[str, float]:
        """Those of `weights` whose variants config.yaml lets serve (all, for a model the
        repository does not hold): a rollback from 100 % gave its old share back to a variant
        a redeploy had removed since, routes no producer serves, so they served config.yaml's,
        maybe the canary's variant still taking everything."""
        config = self.repository.get(model)
        if config is None:
            return weights
        return {name: weight for name, weight in weights.items() if _serves(config, name)}

    async def announce(
        self, canary: Canary, kind: str, reason: str | None, seen: dict[str, Any]
    ) -> None:
        """Save the canary as decided with its decision's event, in one step (an event recorded
        after the save was lost to a Redis error between the two), then log and webhook it; the
        leader's look shows it in the gauges. Fenced by the look's lease, as every save is."""
        record = _record(canary, kind, reason, seen)
        owed = owed_webhook(canary, kind, record)
        await self.store.save(canary, _LEASE.get(), record, owed)
        await self._tell(canary, kind, owed)

    async def _tell(self, canary: Canary, kind: str, owed: OwedWebhook | None) -> None:
        """Log a decision and hand over the webhook it was saved owing, if any."""
        log.info("canary %s:%s %s at %g%%", canary.model, canary.variant, kind, canary.weight)
        if owed is not None:
            await self._hand_over(canary.model, owed)

    async def _hand_over(self, model: str, owed: OwedWebhook) -> bool:
        """Hand an owed webhook to the broker, then settle it; never raised: the decision stands
        (a start or an abort answered 500 for a canary it had started or ended), and what stays
        owed the leader's next look hands over again, under the same event id. False when the
        broker refused it, or refused the last one and its back-off (doubling from 0.1 s up to
        5 s, producer_api/redis_outage.py) has not passed: it stays owed till then."""
        if time.monotonic() < self._hand_over_after:
            return False
        if not await self.webhooks.hand_over("canary", model, owed.url, owed.body):
            refused = BrokerRefused(f"{owed.body['type']} of the canary of {model}")
            self._hand_over_after = time.monotonic() + self._broker.failed(refused)
            return False
        self._broker.recovered()
        try:
            await self.store.settle(model, owed)
        except RedisError as exc:
            log.warning("canary of %s: its %s stays owed (%r)", model, owed.body["type"], exc)
        return True


class BrokerRefused(Exception):
    """The broker did not take an owed webhook (`WebhookDispatcher.hand_over` logged why)."""


def _record(canary: Canary, kind: str, reason: str | None, seen: dict[str, Any]) -> dict[str, Any]:
    """A decision's event: the canary as decided, why, and the numbers behind it."""
    return {
        "at": stamp(),
        "type": kind,
        "model": canary.model,
        "variant": canary.variant,
        "baseline": canary.baseline,
        "state": canary.state,
        "weight": canary.weight,
        "reason": reason,
        "numbers": seen,
    }


def owed_webhook(canary: Canary, kind: str, record: dict[str, Any]) -> OwedWebhook | None:
    """The webhook a decision owes from its save, if the canary has one; its event id is
    fixed here, so a re-send is the same event."""
    if not canary.webhook:
        return None
    return OwedWebhook(canary.webhook, event(f"model.canary.{kind}", OPERATOR, record))


def _serves(config: ModelConfig, name: str) -> bool:
    """Whether config.yaml lets the variant take live traffic (see serving_variant)."""
    try:
        serving_variant(config, name)
    except (UnknownVariant, InvalidRoutes):
        return False
    return True


def _handed_back(kept: dict[str, float], seen: dict[str, float]) -> dict[str, float]:
    """The other primaries' weights a rollback hands traffic back to: `kept`, those they had
    before the canary, while the live ones, `seen`, are them scaled (each step scales them);
    `seen` once their ratios changed (an operator's), and `kept` at 100 %, where none is seen."""
    if not seen:
        return kept
    if kept.keys() != seen.keys():
        return seen
    kept_total, seen_total = sum(kept.values()), sum(seen.values())
    scaled = all(
        abs(seen[name] / seen_total - weight / kept_total) <= RATIO_SLACK
        for name, weight in kept.items()
    )
    return kept if scaled else seen


def _restored(routes: Routes, held: dict[str, float]) -> Routes:
    """`routes` with the others at their `held` weights where those are what the scaling gave
    them back, but for float rounding: a rollback scaled them from the step's, and 60/40 came
    back as 60/39.99999999999999, routes no operator had set."""
    if any(
        abs(routes.weights.get(name, 0.0) - weight) > WEIGHT_SLACK for name, weight in held.items()
    ):
        return routes
    return Routes(routes.weights | held, routes.shadows, routes.sticky_by, routes.version)


def _author(canary: Canary, state: CanaryState = "running") -> str:
    """Who the route log says wrote the canary's changes, an abort's apart (its routes outlive
    a lost save of its record, and were then taken up as a rollback's)."""
    author = f"canary:{canary.variant}"
    return f"{author} (aborted)" if state == "aborted" else author
