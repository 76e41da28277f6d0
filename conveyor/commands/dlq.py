"""`conveyor dlq list|show|replay|purge MODEL [--variant V]`: manage a partition's dead letters;
`conveyor dlq partitions`: which partitions hold any."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from shared.keys import Keys

# Redis, the job store and the model repository are imported in the functions that use them:
# `conveyor dlq --help` and a usage error need none of them.
if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from shared.dead_letters import Admission, DeadLetters, ReplayResult
    from shared.model_repository import ModelConfig
    from shared.settings import Settings

T = TypeVar("T")


def _run(
    model: str, variant: str, action: Callable[[DeadLetters], Awaitable[T]], replays: bool = False
) -> T:
    """`action` on the partition's dead letters; `replays`: it enqueues jobs, so the partition
    must still be served (`_served_limits`)."""
    from conveyor.local_stack import with_redis
    from shared.dead_letters import DeadLetters, submit_checks
    from shared.job_store import JobStore
    from shared.redis_clock import adopt_redis_clock

    async def on(client: aioredis.Redis, settings: Settings) -> T:
        keys = Keys(settings.key_prefix)
        store = JobStore(client, keys, settings.result_ttl_s)
        letters = DeadLetters(store, keys, model, variant)
        if refused := await letters.unreadable():
            raise click.ClickException(refused)
        if not await letters.partition_exists():
            raise click.ClickException(
                f"no partition {model}:{variant} in this Redis (neither its queue nor its "
                "dead-letter stream exists): check MODEL and --variant"
            )
        if replays:  # queued fairly, admitted by cap, deadline and checks, as a submit would be
            config = _served_config(settings, model, variant)
            # its jobs' stamps and the lanes' drain-rate window on Redis's clock, as a
            # producer's: workers judge them there (this host 30 s behind expired them all)
            await adopt_redis_clock(client)
            fair_window, max_length = config.fair_window_of(variant), config.queue.max_length
            admission = await _admission(client, keys, config, variant)
            # the webhook policy is the producers': checked where this environment has it
            checks = submit_checks(config, settings if settings.webhook_secret else None)
            limits = (fair_window, max_length, admission, checks)
            letters = DeadLetters(store, keys, model, variant, *limits)
        return await action(letters)

    return with_redis(on)


async def _admission(
    client: aioredis.Redis, keys: Keys, config: ModelConfig, variant: str
) -> Admission:
    """The producers' deadline admission of the partition, by its lanes' drain rate read once
    now (one refresh: a few round trips per replay, none per letter)."""
    from shared.model_repository import ModelRepository
    from shared.queue_eta import QueueEta
    from shared.queue_position import QueuePositions

    eta = QueueEta(client, QueuePositions(client, keys), ModelRepository({config.name: config}))
    await eta.refresh()
    return eta.admission(config, variant)


def _served_config(settings: Settings, model: str, variant: str) -> ModelConfig:
    """The partition's model in this machine's model repository, so a replay is queued
    fairly where the producers would, and admitted as they admit submits (never past the cap,
    nor to start past its deadline). A partition the repository lacks (or a repository that
    cannot be read) is refused: no worker serves it, and its replays would stay queued for ever
    (the producers refuse its submits as unknown)."""
    from shared.model_repository import ModelConfigError, ModelRepository

    try:
        ((config, _),) = ModelRepository.load(settings.model_repository).partitions(
            [f"{model}:{variant}"]
        )
    except ModelConfigError as exc:
        raise click.ClickException(
            f"cannot replay {model}:{variant}: {exc}. A replay is queued only for a partition the"
            " model repository has (no worker serves another: its replays would stay queued);"
            " set CONVEYOR_MODEL_REPOSITORY to the workers' repository. The letters stay."
        ) from None
    return config


@click.group("dlq")
def command() -> None:
    """Dead-letter queues (entries that exhausted max_deliveries)."""


model_argument = click.argument("model")
variant_option = click.option(
    "--variant", default="default", show_default=True, help="The model's variant (partition)."
)
ids_option = click.option("--id", "ids", multiple=True, help="Only these DLQ entry ids.")


@command.command("list")
@model_argument
@variant_option
def list_letters(model: str, variant: str) -> None:
    """Print each dead letter, oldest first: DLQ id, job id, deliveries, reason. A page at a
    time, as it is read: the whole stream, payloads and all, was read before the first line (a
    DLQ of 100,000 letters held every one in memory at once)."""

    async def echo(letters: DeadLetters) -> None:
        async for page in letters.pages():
            for letter in page:
                job_id = letter.job_id or "-"  # an undecodable letter may name none
                click.echo(f"{letter.dlq_id}\t{job_id}\t{letter.deliveries}\t{letter.reason}")

    _run(model, variant, echo)


@command.command("partitions")
def partitions() -> None:
    """Print each partition that holds dead letters and how many (tab-separated), those of a
    model or variant the model repository no longer has included: found by their keys in
    Redis, as the console lists them. Their letters can be listed and purged, not replayed."""
    from conveyor.local_stack import with_redis
    from shared.dead_letters import DeadLetters, lettered_partitions
    from shared.job_store import JobStore

    async def each(client: aioredis.Redis, settings: Settings) -> None:
        keys = Keys(settings.key_prefix)
        store = JobStore(client, keys, settings.result_ttl_s)
        for model, variant in await lettered_partitions(client, keys):
            letters = DeadLetters(store, keys, model, variant)
            if refused := await letters.unreadable():
                click.echo(f"{model}:{variant}: {refused}", err=True)
            elif depth := await letters.depth():  # an emptied stream stays behind: not listed
                click.echo(f"{model}:{variant}\t{depth}")

    with_redis(each)


@command.command("show")
@model_argument
@click.argument("dlq_id")
@variant_option
def show(model: str, dlq_id: str, variant: str) -> None:
    """Print one dead letter whole, as JSON: reason, deliveries, when it died, lane, tenant,
    deadline, the job's payload (what it asked) and, while the job's record is kept, its
    attempts (each one's worker, start, end and outcome)."""

    async def whole(letters: DeadLetters) -> dict[str, Any] | None:
        found = await letters.letters_of([dlq_id])
        return await letters.shown(found[0]) if found else None

    shown = _run(model, variant, whole)
    if shown is None:
        raise click.ClickException(_absent(f"{model}:{variant}", dlq_id))
    click.echo(json.dumps(shown, indent=2))


@command.command("replay")
@model_argument
@variant_option
@ids_option
def replay(model: str, variant: str, ids: tuple[str, ...]) -> None:
    """Enqueue dead letters again as new jobs (prints old → new job id), all those the partition
    holds now or the given ids; a letter past its job's deadline, whose lane holds
    queue.max_length jobs, or (queue.admit_by_deadline) that would start past its deadline
    behind the lane's backlog, or whose job today's submit checks refuse (its inputs against the
    model's input schema, its parameters against those the model takes, its webhook URL against
    the webhook policy), is kept, not replayed (prints its job id, DLQ id for `purge --id`, and
    why), then the counts. Refused for a partition the model repository no longer has."""
    from shared.dead_letters import (
        DEADLINE_UNMEETABLE,
        INPUT_INVALID,
        PARAMETERS_INVALID,
        QUEUE_FULL,
        WEBHOOK_REFUSED,
        ReplayResult,
    )

    async def act(letters: DeadLetters) -> ReplayResult:
        if ids:
            await _say_absent(letters, list(ids))
            return await letters.replay(list(ids))
        # "all" is what is there now: a letter that dies meanwhile (a replayed poison job) waits
        _, upto = await letters.counted()
        return await letters.replay(None, upto) if upto else ReplayResult()

    result = _run(model, variant, act, replays=True)
    for old, new in result.replayed:
        click.echo(f"{old} -> {new}")
    for letter in result.kept:
        why = f"{letter.reason}: {letter.detail}" if letter.detail else letter.reason
        click.echo(f"kept {letter.job_id or '-'} (dead letter {letter.dlq_id}): {why}")
    click.echo(f"replayed {len(result.replayed)}, kept {len(result.kept)}")
    reasons = {letter.reason for letter in result.kept}
    if QUEUE_FULL in reasons:
        click.echo("the lane is full (queue.max_length): replay again once it drains", err=True)
    if DEADLINE_UNMEETABLE in reasons:
        hint = "it cannot start before the deadline behind the lane's backlog, or its workers'"
        click.echo(f"{hint} stall: replay once the lane drains, or purge", err=True)
    if reasons & {INPUT_INVALID, PARAMETERS_INVALID, WEBHOOK_REFUSED}:
        hint = "a submit of that job would be refused now (the model's input_schema, the job"
        click.echo(
            f"{hint} parameters it takes, or the webhook policy): purge it, or resubmit it as it"
            " is allowed now",
            err=True,
        )


@command.command("purge")
@model_argument
@variant_option
@ids_option
@click.option("--yes", "-y", is_flag=True, help="Purge every letter without asking first.")
def purge(model: str, variant: str, ids: tuple[str, ...], yes: bool) -> None:
    """Delete dead letters: the given ids, or every letter the partition holds after a
    confirmation (letters that die after it stay)."""
    if ids:

        async def by_id(letters: DeadLetters) -> int:
            await _say_absent(letters, list(ids))
            return await letters.purge(list(ids))

        click.echo(f"purged {_run(model, variant, by_id)}")
        return
    count, upto = _run(model, variant, lambda d: d.counted())
    if count and not yes:
        click.confirm(f"Purge all {count} dead letters of {model}:{variant}?", abort=True)
    removed = _run(model, variant, lambda d: d.purge(None, upto)) if upto else 0
    click.echo(f"purged {removed}")


async def _say_absent(letters: DeadLetters, ids: list[str]) -> None:
    """One line on stderr per id that names no letter. Not an error: a replay retried after
    its answer was lost finds its letters gone, replayed."""
    for dlq_id in await letters.absent(ids):
        click.echo(_absent(f"{letters.model}:{letters.variant}", dlq_id), err=True)


def _absent(partition: str, dlq_id: str) -> str:
    from shared.codec import is_stream_id

    if not is_stream_id(dlq_id):
        return f"{dlq_id!r} is not a dead letter's id (as `conveyor dlq list` prints them)"
    return f"no dead letter {dlq_id} in {partition} (replayed or purged already, or never one)"
