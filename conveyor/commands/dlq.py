"""`conveyor dlq list|replay|purge MODEL [--variant V]`: manage a partition's dead letters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
import redis.asyncio as aioredis

from conveyor.local_stack import with_redis
from shared.dead_letters import DeadLetters
from shared.job_store import JobStore
from shared.keys import Keys
from shared.model_repository import ModelConfigError, ModelRepository
from shared.settings import Settings

T = TypeVar("T")


def _run(model: str, variant: str, action: Callable[[DeadLetters], Awaitable[T]]) -> T:
    async def on(client: aioredis.Redis, settings: Settings) -> T:
        keys = Keys(settings.key_prefix)
        store = JobStore(client, keys, settings.result_ttl_s)
        letters = DeadLetters(store, keys, model, variant, _fair_window(settings, model, variant))
        if not await letters.partition_exists():
            raise click.ClickException(
                f"no partition {model}:{variant} in this Redis (neither its queue nor its "
                "dead-letter stream exists): check MODEL and --variant"
            )
        return await action(letters)

    return with_redis(on)


def _fair_window(settings: Settings, model: str, variant: str) -> int:
    """The partition's fair window in this machine's model repository, so a replay is queued
    fairly where the producers would; 0 (not fair) where the repository lacks the model."""
    try:
        config = ModelRepository.load(settings.model_repository).models.get(model)
    except ModelConfigError:
        return 0
    return config.fair_window_of(variant) if config is not None else 0


@click.group("dlq")
def command() -> None:
    """Dead-letter queues (entries that exhausted max_deliveries)."""


model_argument = click.argument("model")
variant_option = click.option("--variant", default="default", show_default=True)
ids_option = click.option("--id", "ids", multiple=True, help="Only these DLQ entry ids.")


@command.command("list")
@model_argument
@variant_option
def list_letters(model: str, variant: str) -> None:
    """Print each dead letter: DLQ id, job id, deliveries, reason."""
    for letter in _run(model, variant, lambda d: d.every_entry()):
        click.echo(f"{letter.dlq_id}\t{letter.job_id}\t{letter.deliveries}\t{letter.reason}")


@command.command("replay")
@model_argument
@variant_option
@ids_option
def replay(model: str, variant: str, ids: tuple[str, ...]) -> None:
    """Enqueue dead letters again as new jobs (prints old → new job id); a letter past its
    job's deadline is kept, not replayed (prints its job id, DLQ id for `purge --id`, and
    why), then the counts."""
    result = _run(model, variant, lambda d: d.replay(list(ids) or None))
    for old, new in result.replayed:
        click.echo(f"{old} -> {new}")
    for letter in result.kept:
        click.echo(f"kept {letter.job_id} (dead letter {letter.dlq_id}): {letter.reason}")
    click.echo(f"replayed {len(result.replayed)}, kept {len(result.kept)}")


@command.command("purge")
@model_argument
@variant_option
@ids_option
def purge(model: str, variant: str, ids: tuple[str, ...]) -> None:
    """Delete dead letters (all of the partition's, or the given ids)."""
    removed = _run(model, variant, lambda d: d.purge(list(ids) or None))
    click.echo(f"purged {removed}")
