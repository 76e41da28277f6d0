"""The jobs logic without HTTP: validate against the model repository, pick the partition,
enqueue, wait for results through the reply listener, cancel. Every job belongs to the tenant
of the principal that submitted it; another tenant's job reads as unknown (404)."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from producer_api.auth.principal import Principal
from producer_api.errors import NO_RETRY, REFUSALS, ConveyorError
from producer_api.jobs.admission import BodyPrint
from producer_api.jobs.protocol import PredictRequest
from producer_api.models.serving import model_of
from producer_api.state import ProducerState
from producer_api.task_cancel import uninterrupted
from shared import job_parameters
from shared.codec import RequestEntry
from shared.job_parameters import AS_JOB_FIELDS, FieldNames, ParametersRefused
from shared.job_scripts import UNPLACED
from shared.job_states import IllegalTransition, JobStatus
from shared.job_store import JobNotFound, JobRecord, QueueFull, TooFarBack, stamp_ms
from shared.keys import new_job_id
from shared.metrics import JOBS_REJECTED, JOBS_SUBMITTED
from shared.model_repository import ModelConfig, client_named
from shared.problem_list import listed
from shared.queue_eta import Standing, StartBy
from shared.redis_client import OUT_OF_REACH
from shared.redis_clock import CLOCK
from shared.routing import UnknownVariant
from shared.telemetry import current_trace_context
from shared.webhook_events import job_event, refusal
from shared.webhook_outbox import WebhookOutbox

log = logging.getLogger(__name__)

JOB_ID = re.compile(r"[0-9a-f]{32}")
# How often a long-poll reads a job that has no reply channel (nothing wakes it).
REPLYLESS_POLL_S = 0.25
# What the error handlers answer 503 for (producer_api/errors.py): a submit refused so counts as
# one `unavailable` rejection (the client sees no job, whether or not ENQUEUE ran).
UNAVAILABLE: tuple[type[Exception], ...] = (*OUT_OF_REACH, *REFUSALS)
# The 422 of a `deadline` already past, at submit or once a keyed retry waited on its key.
PAST_DEADLINE = "deadline: already past (Unix seconds)"


# The HTTP status of a job that ended without succeeding, where a route answers with its result
# (`/predict`, non-streamed OpenAI completions).
UNSUCCESSFUL_STATUS: dict[str, int] = {
    JobStatus.FAILED: 422,
    JobStatus.CANCELLED: 409,
    JobStatus.EXPIRED: 504,
}
# Those statuses as the routes' OpenAPI describes them.
UNSUCCESSFUL_DESCRIPTIONS = {
    409: "The job was cancelled",
    422: "Invalid request (or a body that is not acceptable JSON), or the model failed on it",
    504: "The job expired before it ran (its `deadline` or the queue's `max_queue_time_s`)",
}


def unsuccessful(subject: str, status: str, error: dict[str, Any] | None) -> ConveyorError:
    """The error a route answers for `subject` (a job) that ended `status` with `error`."""
    error = error or {}
    message = f"{subject} {status}: {error.get('message', '')}".rstrip(": ")
    code = UNSUCCESSFUL_STATUS.get(status, 500)  # a StrEnum key matches its string
    return ConveyorError(code, error.get("type", status), message)


def not_found(job_id: str) -> ConveyorError:
    """404 naming the id as sent, cut short when long: an id is any path segment (10 kB of one
    came back whole)."""
    return ConveyorError(404, "not_found", f"job {client_named(job_id)} not found")


def checked_id(job_id: str) -> str:
    """Ids are never guessed into Redis keys: anything not shaped like one is simply unknown
    (whole: `match` of `^…$` let an id with a trailing newline through, into a key)."""
    if not JOB_ID.fullmatch(job_id):
        raise not_found(job_id)
    return job_id


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submit's outcome: the job, its variant, whether this call created it, and where it
    stood when enqueued (the 202's `queue_position` and `eta_ms`; none for an earlier job)."""

    job_id: str
    variant: str
    created: bool = True
    standing: dict[str, int | None] = field(default_factory=dict)


class JobsService:
    """`names`: how its refusals name a job's fields (an OpenAI route's, as its client sent
    them)."""

    def __init__(
        self, state: ProducerState, principal: Principal, names: FieldNames = AS_JOB_FIELDS
    ) -> None:
        self.state = state
        self.principal = principal
        self.names = names

    def resolve(self, model: str, body: PredictRequest) -> tuple[ModelConfig, str]:
        config = model_of(self.state, self.principal, model)
        try:
            variant = self.state.traffic.route(
                config, body.variant, body.routing_key, self.principal.tenant
            )
        except UnknownVariant as exc:
            raise ConveyorError(404, "not_found", str(exc)) from None
        if problems := config.input_problems(body.inputs):
            where = [self.names.input(problem.path) for problem in problems]
            said = [f"{at}: {problem.why}" for at, problem in zip(where, problems, strict=True)]
            raise ConveyorError(422, "invalid_request", listed(said), param=where[0])
        check_parameters(config, variant, body.parameters, self.names)
        if body.webhook is not None and (why := refusal(body.webhook, self.state.settings)):
            raise ConveyorError(422, "invalid_request", why)
        return config, variant

    def build(self, model: str, body: PredictRequest) -> tuple[RequestEntry, ModelConfig, str]:
        config, variant = self.resolve(model, body)
        job_id = new_job_id(config.name, variant)
        traceparent, tracestate = current_trace_context()
        entry = RequestEntry(
            job_id=job_id,
            payload={
                "inputs": body.inputs,
                "parameters": body.parameters,
                **({"webhook": body.webhook} if body.webhook else {}),
            },
            enqueued_ms=stamp_ms(),
            deadline_ms=_deadline_ms(body),
            tenant=self.principal.tenant,
            reply=self.state.replies.channel(job_id),
            traceparent=traceparent,
            tracestate=tracestate,
        )
        return entry, config, variant

    async def enqueue(
        self,
        entry: RequestEntry,
        config: ModelConfig,
        variant: str,
        body: PredictRequest,
        placed: bool = True,
    ) -> int:
        """Append to the partition, or 429 when it holds `queue.max_length` entries already,
        the key has its `max_in_flight` jobs queued or running, or (`queue.admit_by_deadline`)
        the job would start after its deadline or after `queue.max_queue_time_s` (either way a
        worker would only expire it); each refusal, a 503 too, counted by reason. Returns the
        job's position in its queue (`placed`; else -1 where not counted: see _create)."""
        fields: dict[str, str | int] = {"model": config.name, "variant": variant}
        if body.webhook:
            fields["webhook"] = body.webhook
        try:
            async with self._in_flight_slot(entry, fields):
                position = await self._create(entry, config, variant, body, fields, placed)
        except UNAVAILABLE:
            JOBS_REJECTED.labels(config.name, variant, "unavailable").inc()
            raise
        JOBS_SUBMITTED.labels(config.name, variant, body.priority).inc()
        if body.priority == "online":
            self.state.traffic.shadow(config, entry, variant)
        # DEBUG: a line per job costs ~3 % of a producer's CPU; the worker's one line per
        # micro-batch names every job id with its trace id
        log.debug("job accepted", extra={"job_id": entry.job_id, "model": config.name})
        return position

    async def _create(
        self,
        entry: RequestEntry,
        config: ModelConfig,
        variant: str,
        body: PredictRequest,
        fields: dict[str, str | int],
        placed: bool,
    ) -> int:
        """ENQUEUE the job, admitted by the partition's length and (`admit_by_deadline`) the
        entries that may wait ahead of it; a refusal is a 429, counted by reason. Unless
        `placed`, a job no bound admits is enqueued UNPLACED: no position shown, none counted
        (one command fewer per ENQUEUE call of a plain lane)."""
        bulk, keys = body.priority == "bulk", self.state.keys
        stream = (keys.bulk_queue if bulk else keys.queue)(config.name, variant)
        eta = self.state.queue_eta
        start_by = StartBy.of(config, entry.enqueued_ms, entry.deadline_ms)
        max_ahead = eta.max_ahead(config, variant, bulk, start_by)
        if max_ahead == -1 and not placed:  # no bound: none counted
            max_ahead = UNPLACED
        try:
            # a stall lets none wait ahead (0), which ENQUEUE admits on an empty lane: looked
            # at only then, not on every submit
            stalled = eta.stalled_ahead(config, variant, bulk, start_by) if max_ahead == 0 else None
            if stalled is not None:
                raise TooFarBack(stream, stalled)
            return await self.state.job_store.create(
                entry,
                stream,
                fields,
                config.queue.max_length,
                max_ahead,
                (config.fair_window_of(variant), self.principal.weight),
            )
        except QueueFull as full:
            JOBS_REJECTED.labels(config.name, variant, "queue_full").inc()
            raise await self.state.backpressure.queue_full(stream, full.length) from None
        except TooFarBack as late:
            JOBS_REJECTED.labels(config.name, variant, "deadline_unmeetable").inc()
            standing = eta.standing(config, variant, bulk, late.ahead)
            moves = _moves(body, entry.deadline_ms)
            raise _unmeetable(standing, entry, start_by, moves) from None

    @asynccontextmanager
    async def _in_flight_slot(
        self, entry: RequestEntry, fields: dict[str, str | int]
    ) -> AsyncIterator[None]:
        """Hold one of the key's in-flight slots for the job, given back if it is not enqueued.
        The job hash names its slot (`inflight`) so whoever ends the job can free it."""
        quota = self.principal.quota
        if quota is None:
            yield
            return
        limiter = self.state.in_flight
        # None while the admit's reply is awaited: a cancel raised once it came (group commit
        # raises it after the flush) leaves the slot taken, so the clean-up covers the admit too
        admitted: bool | None = None
        try:
            admitted = await limiter.admit(
                self.principal.limits_id, entry.job_id, quota.max_in_flight
            )
            if not admitted:
                raise self._too_many_in_flight(fields, quota.max_in_flight)
            entry.inflight = self.state.keys.in_flight(self.principal.limits_id)
            fields["inflight"] = entry.inflight
            yield
        except BaseException as exc:
            # refused, it took no slot; an admit that failed (an outage) is left to the prune,
            # as its clean-up would wait on the same Redis
            if admitted or (admitted is None and isinstance(exc, asyncio.CancelledError)):
                await uninterrupted(self._given_back(entry.job_id, exc, self._release_slot))
            raise

    @staticmethod
    def _too_many_in_flight(fields: dict[str, str | int], cap: int) -> ConveyorError:
        """The 429 of a key at its `max_in_flight`, counted as a rejection."""
        JOBS_REJECTED.labels(fields["model"], fields["variant"], "too_many_in_flight").inc()
        return ConveyorError(
            429,
            "too_many_in_flight",
            f"this API key has {cap} jobs queued or running; retry when one ends",
            {"Retry-After": "1"},
        )

    async def _release_slot(self, job_id: str) -> None:
        try:  # not raised over the failure it followed: a 429 is not made a 503
            await self.state.in_flight.release(self.principal.limits_id, job_id)
        except RedisError as lost:  # pruned at the cap: its job has no hash
            log.warning("the in-flight slot of job %s was kept (%r)", job_id, lost)

    async def submit(
        self, model: str, body: PredictRequest, idempotency_key: str | None = None
    ) -> Submitted:
        """Enqueue a job. With an idempotency key seen before (same body), nothing is enqueued
        and the first job's id comes back."""
        if idempotency_key is not None:
            return await self._submit_once(model, body, idempotency_key)
        entry, config, variant = self.build(model, body)
        position = await self.enqueue(entry, config, variant, body)
        return self._submitted(entry, config, variant, body, position)

    async def _submit_once(self, model: str, body: PredictRequest, key: str) -> Submitted:
        """A retry answers with the job its first try was accepted as, also when the request
        would be refused now (its deadline has passed, the model's routes changed)."""
        idempotency, exists = self.state.idempotency, self.state.job_store.exists
        tenant = self.principal.tenant
        body_print = BodyPrint.of({"model": model, **body.model_dump(mode="json")})
        try:
            entry, config, variant = self.build(model, body)
        except ConveyorError:
            if (first := await idempotency.used_for(tenant, key, body_print, exists)) is None:
                raise
            return Submitted(first, "", created=False)
        try:
            first = await idempotency.claim(tenant, key, entry.job_id, body_print, exists)
            if first is not None:
                return Submitted(first, variant, created=False)
            # its deadline may have passed while it waited on an earlier try's claim
            _refuse_past(body, entry.deadline_ms)
            position = await self.enqueue(entry, config, variant, body)
        except BaseException as exc:
            release = partial(idempotency.release, tenant, key)
            await uninterrupted(self._given_back(entry.job_id, exc, release))
            raise
        return self._submitted(entry, config, variant, body, position)

    async def _given_back(
        self, job_id: str, failure: BaseException, give_back: Callable[[str], Awaitable[None]]
    ) -> None:
        """`give_back(job_id)` when the failed enqueue left no job; run `uninterrupted` by its
        callers, as the disconnect watch repeats its cancel while a slow Redis answers."""
        if await self._nothing_enqueued(job_id, failure):
            await give_back(job_id)

    async def _nothing_enqueued(self, job_id: str, failure: BaseException) -> bool:
        """Whether a failed enqueue left no job, so what it claimed (an idempotency key, an
        in-flight slot) can be given back. A refusal enqueued nothing; a Redis error may come
        after ENQUEUE ran (replicas that did not confirm it, a reply lost with its connection),
        and a key given back then would let the client's retry enqueue the job twice. When the
        look for the job fails too, both are kept: a claim whose job never appears is taken
        over once abandoned (`IdempotencyKeys.claim`), a slot whose job has no hash is pruned
        after a grace (`InFlightLimiter`). The look is a read: it waits for no replica."""
        if isinstance(failure, ConveyorError):
            return True
        try:
            return not await self.state.job_store.exists(job_id)
        except RedisError as exc:
            log.warning("job %s may be enqueued (%r): its key and slot are kept", job_id, exc)
            return False

    def _submitted(
        self,
        entry: RequestEntry,
        config: ModelConfig,
        variant: str,
        body: PredictRequest,
        position: int,
    ) -> Submitted:
        """A new job and where it stands (only a 202 shows it: submit-and-wait does not)."""
        bulk = body.priority == "bulk"
        standing = self.state.queue_eta.standing(config, variant, bulk, position)
        return Submitted(entry.job_id, variant, standing=standing.public())

    async def submit_and_wait(
        self,
        model: str,
        body: PredictRequest,
        timeout: float,
        idempotency_key: str | None = None,
    ) -> tuple[str, str, dict[str, Any] | None]:
        """Enqueue with the waiter registered first, so a fast worker cannot beat us to it.
        The view is the ended job's, or, once `timeout` runs out, the job as it stands then
        (queued, with its standing, or running); None when Redis cannot say."""
        if idempotency_key is not None:
            return await self._keyed_and_waited(model, body, timeout, idempotency_key)
        entry, config, variant = self.build(model, body)
        future = await self.state.replies.register(entry.job_id)
        try:
            await self.enqueue(entry, config, variant, body, placed=False)
            view = await self._await_reply(entry.job_id, future, timeout)
        finally:
            self.state.replies.unregister(entry.job_id, future)
        return entry.job_id, variant, view or await self._as_it_stands(entry.job_id)

    async def _keyed_and_waited(
        self, model: str, body: PredictRequest, timeout: float, key: str
    ) -> tuple[str, str, dict[str, Any]]:
        """A keyed submit that waits: the key is claimed before the job exists, so the job (a
        repeat's: its first try's, waited on as the first try was) is waited on once submitted;
        `get` registers its waiter before it reads the job, so a fast end is not missed."""
        submitted = await self.submit(model, body, key)
        view = await self.get(submitted.job_id, timeout)
        return submitted.job_id, str(view.get("variant") or submitted.variant), view

    async def owned(self, job_id: str) -> JobRecord:
        """The caller's job, or 404 when it is unknown or another tenant's (ids do not leak).
        Every route that shows or changes a job (events too) goes through here."""
        checked_id(job_id)
        record = await self.state.job_store.get(job_id)
        if record is None or record.fields.get("tenant", "default") != self.principal.tenant:
            raise not_found(job_id)
        return record

    async def get(self, job_id: str, wait: float, history: bool = False) -> dict[str, Any]:
        """The job's view (with its attempt history when asked: a reply lacks it, so after a
        wait the hash is read again)."""
        checked_id(job_id)
        replies = self.state.replies
        made = replies.made()
        future = await replies.register(job_id, follow=False) if wait > 0 else None
        try:
            record = await self.owned(job_id)
            if future is not None and not record.status.terminal:
                record = await self._heard(record, made)
            if future is None or record.status.terminal:
                return await self._view(record, history)
            if record.fields.get("reply"):
                view = await self._await_reply(job_id, future, wait)
            else:
                view = await self._polled(job_id, wait)
        finally:
            if future is not None:
                replies.unregister(job_id, future)
        return view if view is not None and not history else await self._read(job_id, history)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        await self.owned(job_id)  # another tenant's job reads as unknown
        try:
            record = await self.state.job_store.transition(job_id, JobStatus.CANCELLED)
        except JobNotFound:
            raise not_found(job_id) from None
        except IllegalTransition as exc:
            raise ConveyorError(
                409, "conflict", f"job {job_id} is already {exc.current}; cannot cancel"
            ) from None
        view = record.view()
        url = record.fields.get("webhook")
        body = job_event(view, record.fields.get("tenant", "default"))
        if url and await self.state.webhooks.hand_over("job", job_id, url, body):
            try:  # TRANSITION left it owed; still owed, a worker's reclaimer sends it again
                outbox = WebhookOutbox(self.state.redis, self.state.keys)
                await outbox.settle(record.fields.get("stream", ""), [job_id])
            except RedisError as exc:
                log.warning("cancel of %s: its event stays owed (%r)", job_id, exc)
        return view

    async def _heard(self, record: JobRecord, made: int) -> JobRecord:
        """Follow the channel the job's worker replies on (another producer's, for a job
        submitted through it); the job is read again when that channel was subscribed after
        `made` (by this request or another, meanwhile): a reply published before it went
        unheard."""
        if await self.state.replies.follow(record.fields.get("reply", ""), made):
            return await self.owned(record.job_id)
        return record

    async def _polled(self, job_id: str, timeout: float) -> dict[str, Any] | None:
        """The job's terminal view, read every `REPLYLESS_POLL_S`, or None after `timeout`: a
        job no producer submitted (a dead letter's replay, a batch's line) has no reply
        channel, so nothing publishes its end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(timeout, self.state.settings.max_wait_s)
        while (left := deadline - loop.time()) > 0 and not self.state.draining.asked():
            await asyncio.sleep(min(REPLYLESS_POLL_S, left))
            record = await self.owned(job_id)
            if record.status.terminal:
                return await self._view(record, False)
        return None

    async def _await_reply(
        self, job_id: str, future: asyncio.Future[dict[str, Any]], timeout: float
    ) -> dict[str, Any] | None:
        """The job's terminal view, or None after `timeout` (at most `max_wait_s`). A reply
        lacks what only the hash counts (`attempts`; a cancel's, a dead letter's): then the
        hash is read, and the reply answers when Redis fails that read."""
        timeout = min(timeout, self.state.settings.max_wait_s)
        if self.state.draining.asked():
            return None
        try:
            view = await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return None
        if not view:  # woken as the producer stops (`ReplyListener.wake_all`): as it stands
            return None
        return view if "attempts" in view else await self._as_it_stands(job_id, view)

    async def _as_it_stands(
        self, job_id: str, known: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """An accepted job's view after a wait ran out or a reply came, else `known` (what the
        reply said). Redis failing here is no 503: the job was accepted, and a client told
        otherwise would submit it again."""
        try:
            return await self._read(job_id)
        except RedisError as exc:
            log.warning("job %s accepted, but its state could not be read: %r", job_id, exc)
            return known

    async def _read(self, job_id: str, history: bool = False) -> dict[str, Any]:
        return await self._view(await self.owned(job_id), history)

    async def _view(self, record: JobRecord, history: bool) -> dict[str, Any]:
        """A queued job's view carries where it stands (`queue_position`, `eta_ms`); its
        outputs are answered as the worker wrote them (as a reply's are)."""
        view = record.view(history, spliced=True)
        if record.status == JobStatus.QUEUED:
            standing = await self.state.queue_eta.of(record)
            view.update(standing.public() if standing else {})
        return view


def check_parameters(
    config: ModelConfig,
    variant: str,
    parameters: dict[str, Any],
    names: FieldNames = AS_JOB_FIELDS,
) -> None:
    """The job's parameters as `shared.job_parameters.check_parameters` checks them (a dead
    letter's replay checks them so too), a refusal answered as a 422 naming the parameter."""
    try:
        job_parameters.check_parameters(config, variant, parameters, names)
    except ParametersRefused as refused:
        raise ConveyorError(422, "invalid_request", refused.message, param=refused.param) from None


def _deadline_ms(body: PredictRequest) -> int:
    """The job's deadline in Unix ms (0: none): with both `deadline` and `ttl_s` the sooner, as
    the job must not run past either (the `ttl_s` was dropped). One already past is refused
    (422), since the job could only be accepted to expire. Both on Redis's clock, which the
    worker judges it by: a client's `deadline` is its statement, kept as given."""
    now = CLOCK.now()
    if body.deadline is not None and body.deadline <= now:
        raise ConveyorError(422, "invalid_request", PAST_DEADLINE)
    limits = []
    if body.deadline is not None:
        limits.append(int(body.deadline * 1000))
    if body.ttl_s is not None:
        limits.append(int((now + body.ttl_s) * 1000))
    return min(limits, default=0)


def _refuse_past(body: PredictRequest, deadline_ms: int) -> None:
    """422 for a job whose deadline passed before its ENQUEUE (a keyed retry's, waiting on an
    earlier try's claim): its `ttl_s` counts from its arrival, so it could only expire."""
    if not deadline_ms or deadline_ms > stamp_ms():
        return
    if _moves(body, deadline_ms):
        raise ConveyorError(422, "invalid_request", "ttl_s: ran out before it could be enqueued")
    raise ConveyorError(422, "invalid_request", PAST_DEADLINE)


def _moves(body: PredictRequest, deadline_ms: int) -> bool:
    """Whether the job's deadline moves with a retry: it is its `ttl_s`'s, not a `deadline`."""
    return body.deadline is None or deadline_ms < int(body.deadline * 1000)


def _unmeetable(
    standing: Standing, entry: RequestEntry, start_by: StartBy, moves: bool
) -> ConveyorError:
    """429 for a job that would start after `start_by`. A limit that moves with a retry (a
    deadline that `moves`, from `ttl_s`; `max_queue_time_s`) gets Retry-After, how long until
    as many entries have drained as it was too far back (1 to 60 s); an absolute deadline none:
    the queue drains no faster than it nears, so the same request later is refused the same (a
    client retried it to the deadline), and `x-should-retry: false`."""
    ahead = f"{standing.queue_position} jobs are ahead"
    if standing.eta_ms is None:  # the drain rate was read again meanwhile, and is gone
        return ConveyorError(
            429, "deadline_unmeetable", f"{ahead}, more than can start before {start_by.what}"
        )
    late_s = (entry.enqueued_ms + standing.eta_ms - start_by.ms) / 1000
    late = f"{late_s:.1f}s too late for {start_by.what}"
    message = f"{ahead}: it would start in about {standing.eta_ms} ms, {late}"
    headers = None
    if moves or start_by.queue_time:
        wait = min(60, max(1, math.ceil(late_s)))
        headers = {"Retry-After": str(wait)}
        later = "" if start_by.queue_time else " or with a later deadline"
        message += f"; retry in {wait}s{later}"
    else:  # said to SDKs that retry a 429 by default (OpenAI's, Stainless's) too
        headers = NO_RETRY
        message += "; set a later deadline"
    return ConveyorError(429, "deadline_unmeetable", message, headers, {"eta_ms": standing.eta_ms})
