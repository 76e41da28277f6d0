"""HTTP routes of the operator console (`/console`): server-rendered pages (Jinja2, autoescaped),
one SSE stream of the per-process summaries, and POST actions guarded by a CSRF token. Every
response carries a strict Content-Security-Policy (`headers.py`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import SplitResult, urlsplit

import anyio
from fastapi import APIRouter, Depends, Form, Header, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from redis.exceptions import RedisError
from sse_starlette import ServerSentEvent

from producer_api.auth import Principal
from producer_api.auth.dependencies import throttle
from producer_api.batch_api.serving import BATCH_ID, BatchApiService, not_found
from producer_api.console.job_browser import JobFilter, job_page, recent_jobs
from producer_api.console.login_throttle import bucket_of
from producer_api.console.route_board import route_board
from producer_api.console.service import Console
from producer_api.console.session import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_MAX_AGE_S,
    MAX_AGE_S,
    ConsoleSession,
    LoginRequired,
    SessionSigner,
    check_csrf,
    check_login_csrf,
    current_session,
    end_replaced,
    login_key,
    still_open,
)
from producer_api.errors import ConveyorError
from producer_api.events.api_router import PING_S, server_sent
from producer_api.events.serving import EventsService
from producer_api.jobs.serving import JOB_ID
from producer_api.live_feed import while_holds
from producer_api.responses import JsonlResponse
from producer_api.state import ProducerState, producer_state
from producer_api.stream_places import take_place
from producer_api.stream_shutdown import BoundedEventSource
from shared.codec import as_text, dumps, is_stream_id
from shared.dead_letters import DeadLetter, DeadLetters, lettered_partitions, submit_checks
from shared.job_states import JobStatus
from shared.job_store import JobRecord
from shared.model_repository import ModelConfigError, client_named
from shared.settings import Settings

HERE = Path(__file__).parent
LETTERS_SHOWN = 200  # per partition, oldest first
BATCHES_SHOWN = 100  # per viewer, newest first, with how many it may see in all
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
STATUSES = [status.value for status in JobStatus]  # what the Jobs page filters by


router = APIRouter(prefix="/console", include_in_schema=False)
templates = Jinja2Templates(directory=HERE / "templates")

State = Annotated[ProducerState, Depends(producer_state)]
Event = dict[str, str] | ServerSentEvent  # one server-sent event: its name and data (its id)
Feed = AsyncGenerator[Event, None]


async def console(request: Request) -> Console:
    service: Console = request.app.state.console
    return service


Service = Annotated[Console, Depends(console)]


async def signed_in(request: Request, state: State, service: Service) -> ConsoleSession:
    """The caller's console session; without one, a redirect to the login page. A session whose
    key no longer holds `read` (stored again with fewer scopes) is none: a login with that key
    is refused, yet its session went on opening every page and feed. It is ended, not only
    refused: it opened the console again once the key held `read` again, after a logout too
    (sent to the login page, as every request of it)."""
    try:
        current = await current_session(state, service.signer, service.sessions, request)
    except LoginRequired:
        current = None
    if current is not None and not current.principal.may("read"):
        await service.sessions.close(current.nonce)
        current = None
    if current is None:
        raise HTTPException(303, "login required", {"Location": _home(request, "/login")})
    return current


SignedIn = Annotated[ConsoleSession, Depends(signed_in)]


async def session(state: State, current: SignedIn) -> ConsoleSession:
    """The caller's console session, the request taken from its key's bucket as on /v1 (429
    with Retry-After): a key limited there read thousands of job hashes a request here, as
    often as it liked. Static files, a live feed's rechecks of its session and a logout (a user
    must be able to sign out while the key is busy elsewhere) are not counted."""
    await throttle(state, current.principal)
    return current


Session = Annotated[ConsoleSession, Depends(session)]


async def admin(current: Session) -> ConsoleSession:
    if not current.admin:
        raise ConveyorError(403, "forbidden", "this page needs an admin key")
    return current


Admin = Annotated[ConsoleSession, Depends(admin)]


def _public_url(request: Request) -> SplitResult:
    """CONVEYOR_PUBLIC_URL in parts, each empty where it is unset."""
    settings: Settings = request.app.state.settings
    return urlsplit(settings.public_url)


def console_base(request: Request) -> str:
    """The path the browser reaches the console under, before `/console` ('' by default): that
    of CONVEYOR_PUBLIC_URL when set (a proxy that strips a prefix, as nginx's `location
    /conveyor/ { proxy_pass http://producer/; }`, tells the producer nothing of it), else the
    request's ASGI root_path (uvicorn --root-path). Every link, form, redirect, feed URL and
    cookie path of the console starts with it: `/console` alone led out of the prefix."""
    public = _public_url(request)
    return public.path if public.scheme else str(request.scope.get("root_path", ""))


def _home(request: Request, path: str = "") -> str:
    """The browser's path of the console page `path` (`/login`; '' for the overview)."""
    return f"{console_base(request)}/console{path}"


def _page(request: Request, name: str, current: ConsoleSession | None, **context: Any) -> Response:
    context |= {
        "session": current,
        "page": name.removesuffix(".html"),
        "base": console_base(request),
    }
    return templates.TemplateResponse(request, name, context)


def _see(request: Request, path: str = "") -> Response:
    return RedirectResponse(_home(request, path), status_code=303)


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        raise ConveyorError(404, "not_found", "no such file")
    return FileResponse(HERE / "static" / name, media_type=STATIC[name])


@router.get("/login")
async def login_page(request: Request, service: Service) -> Response:
    return _login_form(request, service.signer, "", 200)


def _login_form(request: Request, signer: SessionSigner, error: str, status: int) -> Response:
    """The login page, with a fresh pre-login cookie and its CSRF token."""
    cookie, nonce = signer.issue("", LOGIN_MAX_AGE_S)
    page = _page(request, "login.html", None, error=error, csrf=signer.csrf(nonce))
    page.status_code = status
    _set_cookie(request, page, LOGIN_COOKIE, cookie, LOGIN_MAX_AGE_S)
    return page


def _set_cookie(request: Request, response: Response, name: str, value: str, age: int) -> None:
    """A console cookie, or its removal (`age` 0), scoped to the console's path as the browser
    sees it. Secure where the browser speaks https: to this producer, or to a proxy in front
    that ends TLS (CONVEYOR_PUBLIC_URL https), which reaches the producer over plain http."""
    secure = "https" in (request.url.scheme, _public_url(request).scheme)
    response.set_cookie(
        name,
        value,
        max_age=age,
        path=_home(request),
        httponly=True,
        samesite="strict",
        secure=secure,
    )


@router.post("/login")
async def login(
    request: Request,
    state: State,
    service: Service,
    key: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    """A refusal, a lapsed form's included (its pre-login cookie lives LOGIN_MAX_AGE_S: a form
    left open longer answered a bare JSON 403), shows the form again with why, ready to retry.
    A login ends the session the browser was signed in to (`end_replaced`)."""
    signer = service.signer
    try:
        check_login_csrf(signer, request.cookies.get(LOGIN_COOKIE, ""), csrf)
        bucket = bucket_of(request.client.host if request.client else None)
        principal = await login_key(state, service.logins, bucket, key.strip())
    except ConveyorError as refused:
        form = _login_form(request, signer, refused.message, refused.status)
        form.headers.update(refused.headers or {})  # a throttled login's Retry-After
        return form
    await end_replaced(signer, service.sessions, request.cookies.get(COOKIE, ""))
    response = _see(request)
    cookie, nonce = signer.issue(principal.key_id)
    await service.sessions.open(nonce, principal.key_id)
    _set_cookie(request, response, COOKIE, cookie, MAX_AGE_S)
    _set_cookie(request, response, LOGIN_COOKIE, "", 0)
    return response


@router.post("/logout")
async def logout(
    request: Request, current: SignedIn, service: Service, csrf: Annotated[str, Form()] = ""
) -> Response:
    check_csrf(current, csrf)
    if current.nonce:
        await service.sessions.close(current.nonce)
    response = _see(request, "/login")
    _set_cookie(request, response, COOKIE, "", 0)
    return response


@router.get("")
async def overview(request: Request, current: Session, service: Service) -> Response:
    return await _summary_page(request, "overview.html", current, service)


@router.get("/workers")
async def workers(request: Request, current: Session, service: Service) -> Response:
    return await _summary_page(request, "workers.html", current, service)


async def _summary_page(
    request: Request, name: str, current: ConsoleSession, service: Console
) -> Response:
    """A page drawn from the summary every viewer shares, as this session may see it."""
    snapshot = summary_for(await service.summaries.current(), current)
    return _page(request, name, current, snapshot=snapshot)


def summary_for(snapshot: dict[str, Any], current: ConsoleSession) -> dict[str, Any]:
    """The summary as a session may see it: the partitions and workers of the models its key
    may use, admin or not (every model's queues and rates, and every worker with its host and
    pid, were shown to a key `GET /v1/models` shows one model); every tenant's batches of
    those models to an admin, anyone else their tenant's: the newest BATCHES_SHOWN of them,
    cut after the tenant's are picked (every running batch was sent to every viewer every
    second, and drawn as a row: thousands of them made a page and a feed of megabytes)."""
    principal = current.principal
    seen = _usable_only(snapshot, principal) if principal.models else snapshot
    batches = [b for b in seen["batches"] if _sees(current, b["tenant"], b["model"] or "")]
    return {**seen, "batches": batches[:BATCHES_SHOWN], "batches_total": len(batches)}


def _sees(current: ConsoleSession, tenant: str, model: str) -> bool:
    """Whether the session sees a job or batch of `tenant` and `model`: its tenant's, or any
    tenant's for an admin, of the models it reaches."""
    return current.reaches(model) and (current.admin or tenant == current.principal.tenant)


def _usable_only(snapshot: dict[str, Any], principal: Principal) -> dict[str, Any]:
    """The summary's partitions and workers cut to the models `principal` may use."""

    def usable(partitions: list[str]) -> list[str]:
        return [p for p in partitions if principal.may_use(p.partition(":")[0])]

    workers = [{**w, "models": usable(w["models"])} for w in snapshot["workers"]]
    return {
        **snapshot,
        "partitions": [p for p in snapshot["partitions"] if principal.may_use(p["model"])],
        "workers": [w for w in workers if w["models"]],
    }


def _while_open(
    state: ProducerState,
    service: Console,
    current: ConsoleSession,
    feed: Feed,
    place: str | None = None,
) -> Feed:
    """A live feed that ends with its session (a logout, from any replica; the key revoked; the
    session's expiry): looked at again every CONVEYOR_STREAM_RECHECK_S, events or none. A feed
    holding a `place` among its key's open streams renews it at each look, and ends once another
    stream took it (its place lapsed while the feed went unread)."""
    holds = partial(_holds, state, service, current, place)
    return while_holds(feed, holds, state.settings.stream_recheck_s)


async def _holds(
    state: ProducerState, service: Console, current: ConsoleSession, place: str | None
) -> bool:
    """Whether the feed's session is still open and its place among its key's streams still
    its own; a Redis that does not answer cuts no feed (`still_open`)."""
    if not await still_open(state, service.sessions, current):
        return False
    quota = current.principal.quota
    if place is None or quota is None:
        return True
    try:
        return await state.open_streams.hold(current.principal.limits_id, place, quota.max_streams)
    except RedisError:
        return True


async def _given_back(
    state: ProducerState, principal: Principal, place: str | None, feed: Feed
) -> Feed:
    """`feed`, its place given back when it ends, though cancelled (the browser went away);
    with Redis not answering, the place lapses instead."""
    try:
        async with aclosing(feed):
            async for event in feed:
                yield event
    finally:
        if place is not None:
            with anyio.CancelScope(shield=True), suppress(RedisError):
                await state.open_streams.release(principal.limits_id, place)


@router.get("/stream")
async def stream(state: State, current: Session, service: Service) -> Response:
    """The one live feed of every console page: a summary per second, batches cut to the
    viewer's tenant, an admin's to the models its key may use. Costs no Redis command per
    viewer but its session's look and its place's renewal every CONVEYOR_STREAM_RECHECK_S."""
    place = await take_place(state, current.principal)

    async def events() -> Feed:
        async for snapshot in service.summaries.follow():
            yield {"event": "summary", "data": as_text(dumps(summary_for(snapshot, current)))}

    feed = _while_open(state, service, current, events(), place)
    return BoundedEventSource(_given_back(state, current.principal, place, feed), ping=15)


@router.get("/jobs")
async def jobs(
    request: Request,
    state: State,
    current: Session,
    id: str = "",
    status: str = "",
    model: str = "",
    tenant: str = "",
) -> Response:
    if id.strip():
        return _see(request, f"/jobs/{id.strip()}")
    if status and status not in STATUSES:  # listed as none matching, though jobs had it
        known = ", ".join(STATUSES)
        raise ConveyorError(
            422, "invalid_request", f"no job status {client_named(status)}: one of {known}"
        )
    if not current.admin:
        tenant = current.principal.tenant
    wanted = JobFilter(status=status, model=model, tenant=tenant)
    rows = await recent_jobs(state.redis, state.keys, state.repository, wanted, current.reaches)
    models = [c.name for c in state.repository if current.principal.may_use(c.name)]
    return _page(request, "jobs.html", current, jobs=rows, wanted=wanted, models=models)


@router.get("/jobs/{job_id}")
async def job(request: Request, state: State, current: Session, job_id: str) -> Response:
    record = await _visible(state, current, job_id)
    config = state.repository.get(record.fields.get("model", ""))
    generates = config is not None and config.kind == "generate"
    page = await job_page(state, record)
    return _page(request, "job.html", current, job=page, generates=generates)


async def _visible(state: ProducerState, current: ConsoleSession, job_id: str) -> JobRecord:
    """The job if the session may see it (its tenant's, or any of the models its key may use
    for admin); else 404. An id not shaped like one is unknown unread: a length bound let any
    text (`{id}%0A`) into a Redis key."""
    record = await state.job_store.get(job_id) if JOB_ID.fullmatch(job_id) else None
    fields = record.fields if record else {}
    if record is None or not _sees(
        current, fields.get("tenant", "default"), fields.get("model", "")
    ):
        raise ConveyorError(404, "not_found", "no such job")
    return record


@router.get("/jobs/{job_id}/tokens")
async def job_tokens(
    state: State,
    current: Session,
    service: Service,
    job_id: str,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """The live token view of an LLM job: its job-events stream (producer_api/events), read as
    the job's own tenant, which an admin may act as. Events carry their ids, so the browser's
    reconnection (after a producer's shutdown, a Redis blip, a proxy's idle timeout) resumes
    after the last token it showed: it replayed the stream from the start, every token shown
    twice."""
    record = await _visible(state, current, job_id)
    reader = replace(current.principal, tenant=record.fields.get("tenant", "default"))
    after = last_event_id if last_event_id and is_stream_id(last_event_id) else None
    events = await EventsService(state, reader).open(job_id, after)
    if events is None:  # the browser has the final event: EventSource's "stop"
        return Response(status_code=204)
    shutdown = anyio.Event()
    return BoundedEventSource(
        _while_open(state, service, current, server_sent(events, shutdown)),
        ping=PING_S,
        shutdown_event=shutdown,
        shutdown_grace_period=state.settings.stream_shutdown_grace_s,
    )


@router.get("/batches")
async def batches(request: Request, current: Session, service: Service) -> Response:
    return await _summary_page(request, "batches.html", current, service)


@router.get("/batches/{batch_id}/{kind}")
async def batch_file(state: State, current: Session, batch_id: str, kind: str) -> Response:
    """The batch's output or errors file, as `GET /v1/batches/{id}/output` serves it, read as
    the batch's own tenant, which an admin may act as (the Batches page lists every tenant's
    batches to an admin; their files answered 404), if its key may use the batch's model."""
    if kind not in ("output", "errors"):
        raise ConveyorError(404, "not_found", "no such file")
    reader = current.principal
    if current.admin and BATCH_ID.fullmatch(batch_id):
        fields = await state.batch_store.read(batch_id) or {}
        if not current.reaches(fields.get("model", "")):
            raise not_found(batch_id)
        reader = replace(reader, tenant=fields.get("tenant", reader.tenant))
    body = await BatchApiService(state, reader).file(batch_id, kind)
    disposition = f'attachment; filename="{batch_id}-{kind}.jsonl"'
    response = JsonlResponse(body)
    response.headers["Content-Disposition"] = disposition
    return response


def _dead_letters(state: ProducerState, model: str, variant: str) -> DeadLetters:
    """A partition's dead letters, replayed as its submits are admitted and checked where the
    model repository serves it; where it does not (`_unserved`), listed and discarded only."""
    config = state.repository.get(model)
    if config is None or variant not in config.variants:
        return DeadLetters(state.job_store, state.keys, model, variant)
    fair_window, max_length = config.fair_window_of(variant), config.queue.max_length
    admission = state.queue_eta.admission(config, variant)  # a replay is admitted as a submit
    checks = submit_checks(config, state.settings)  # and checked as one, by today's rules
    limits = (fair_window, max_length, admission, checks)
    return DeadLetters(state.job_store, state.keys, model, variant, *limits)


def _unserved(state: ProducerState, model: str, variant: str) -> str:
    """Why the partition's letters cannot be replayed ('' where the repository serves it), in
    the words `conveyor dlq replay` refuses with: no worker would run a replay, queued for ever."""
    try:
        if not variant:  # the selector `model:` is every variant of the model, not a partition
            raise ModelConfigError(f"model {model} has no variant ''")
        state.repository.partitions([f"{model}:{variant}"])
    except ModelConfigError as exc:
        why = "Its letters cannot be replayed (no worker would run them), only discarded"
        return f"no longer served: {exc}. {why}"
    return ""


async def _readable(
    state: ProducerState, current: ConsoleSession, partition: str, action: str = ""
) -> DeadLetters:
    """The partition's dead letters: 404 for one the repository does not serve that has neither
    a queue nor letters (a typo), or whose model the session's key may not use (as the key's
    `GET /v1/models` does not list it); 409 where their key is no stream
    (`DeadLetters.unreadable`), or for a replay of a partition the repository no longer serves
    (`_unserved`; its letters stay)."""
    model, _, variant = partition.partition(":")
    letters, unserved = _dead_letters(state, model, variant), _unserved(state, model, variant)
    # one no longer served is known by its keys (as the CLI knows it): a typo has none
    if not current.principal.may_use(model) or (unserved and not await letters.partition_exists()):
        raise ConveyorError(404, "not_found", f"no partition {client_named(partition)}")
    if refused := await letters.unreadable():
        raise ConveyorError(409, "conflict", refused)
    if action == "replay" and unserved:
        raise ConveyorError(409, "conflict", f"cannot replay {partition}: {unserved}")
    return letters


@router.get("/dead-letters")
async def dead_letters(
    request: Request, state: State, current: Admin, partition: str = "", after: str = ""
) -> Response:
    """Each partition's oldest LETTERS_SHOWN letters (those of `partition` after its letter
    `after`: the next page, linked from the one before, or only its oldest 200 were ever
    reachable), and how many it holds (the page said 200 entries of a partition holding 5,000,
    whose "Replay all" replays all 5,000), or why it cannot read them
    (`DeadLetters.unreadable`): every partition the repository serves, and every other that
    holds letters (`lettered_partitions`), said to be no longer served."""
    if after and not is_stream_id(after):  # Redis refused the read: a 500
        raise ConveyorError(
            422, "invalid_request", f"after: {client_named(after)} is no dead-letter id"
        )
    served = [(config.name, variant) for config in state.repository for variant in config.variants]
    lettered = set(await lettered_partitions(state.redis, state.keys)) - set(served)
    partitions: list[tuple[str, list[DeadLetter], int, str, str, str, str]] = []
    for model, variant in [*served, *sorted(lettered)]:
        if not current.principal.may_use(model):
            continue
        name, letters = f"{model}:{variant}", _dead_letters(state, model, variant)
        unserved = _unserved(state, model, variant)
        if refused := await letters.unreadable():
            partitions.append((name, [], 0, refused, unserved, "", ""))
            continue
        start = after if name == partition else ""
        # one more than shown tells whether a next page has any
        shown = await letters.entries(LETTERS_SHOWN + 1, start)
        depth = await letters.depth()
        if unserved and not depth:  # all replayed or purged: an empty stream stays behind
            continue
        more = shown[LETTERS_SHOWN - 1].dlq_id if len(shown) > LETTERS_SHOWN else ""
        partitions.append((name, shown[:LETTERS_SHOWN], depth, "", unserved, start, more))
    return _page(request, "dead_letters.html", current, partitions=partitions)


@router.get("/dead-letters/confirm")
async def confirm(
    request: Request, state: State, current: Admin, action: str, partition: str, entry: str = ""
) -> Response:
    """The confirmation step of replay and discard (a page, so it works without scripts)."""
    if action not in ("replay", "discard"):
        raise ConveyorError(404, "not_found", "no such action")
    letters = await _readable(state, current, partition, action)
    if entry and not await letters.letters_of([entry]):  # not "Replay 1 dead letter?" for none
        raise ConveyorError(
            404, "not_found", f"no dead letter {client_named(entry)} in {partition}"
        )
    # "all" is what the operator was shown: a letter that dies before the click stays
    count, upto = (1, "") if entry else await letters.counted()
    context = {"action": action, "partition": partition, "entry": entry, "count": count}
    return _page(request, "confirm.html", current, upto=upto, **context)


@router.post("/dead-letters/{action}")
async def act(
    request: Request,
    state: State,
    current: Admin,
    action: str,
    partition: Annotated[str, Form()] = "",
    entry: Annotated[str, Form()] = "",
    upto: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    """One letter (`entry`), or all up to the newest the confirmation showed (`upto`; none
    when it showed none)."""
    check_csrf(current, csrf)
    letters = await _readable(state, current, partition, action)
    ids = [entry] if entry else None
    if ids is None and not is_stream_id(upto):
        ids = []  # the confirmation showed no letter: nothing is acted on
    if action == "replay":
        result = await letters.replay(ids, upto)
        done = [new for _, new in result.replayed]
        page = {"action": action, "partition": partition, "jobs": done, "kept": result.kept}
        return _page(request, "done.html", current, **page)
    if action == "discard":
        removed = await letters.purge(ids, upto)
        context = {"action": action, "partition": partition, "removed": removed}
        return _page(request, "done.html", current, **context)
    raise ConveyorError(404, "not_found", "no such action")


@router.get("/routes")
async def routes(request: Request, state: State, current: Admin) -> Response:
    """Weights, canary and shadow comparisons per model the key may use
    (producer_api/console/route_board.py)."""
    rows = await route_board(state.traffic, current.principal.may_use)
    return _page(request, "routes.html", current, rows=rows)
