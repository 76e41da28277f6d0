"""`conveyor keys create|list|revoke`: manage the API keys the producer accepts. A key is
printed once, at creation; Redis keeps only its SHA-256."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from shared.api_keys import SCOPES, ApiKey, ApiKeyStore, InvalidKeySpec, KeySpec
from shared.keys import Keys
from shared.redis_client import connect
from shared.settings import Settings, get_settings

T = TypeVar("T")
DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DEV_KEY_SPEC = KeySpec(tenant="dev", scopes=frozenset(SCOPES), name="development key (conveyor up)")


def _run(action: Callable[[ApiKeyStore], Awaitable[T]], settings: Settings | None = None) -> T:
    async def main() -> T:
        chosen = settings or get_settings()
        client = connect(chosen.redis_url)
        try:
            return await action(ApiKeyStore(client, Keys(chosen.key_prefix)))
        finally:
            await client.aclose()

    return asyncio.run(main())


def create_dev_key(settings: Settings) -> str:
    """The development key `conveyor up` prints: CONVEYOR_DEV_API_KEY if set (so scripts can
    use a known key), else a fresh random one."""

    async def create(store: ApiKeyStore) -> str:
        key, _ = await store.create(DEV_KEY_SPEC, settings.dev_api_key or None)
        return key

    return _run(create, settings)


def _seconds(duration: str | None) -> float:
    if duration is None:
        return 0.0
    match = DURATION.match(duration)
    if match is None:
        raise click.BadParameter("use a number and a unit: 90s, 30m, 12h, 30d")
    return int(match[1]) * _UNITS[match[2]]


def _describe(key: ApiKey) -> dict[str, Any]:
    spec = key.spec
    return {
        "key_id": key.key_id,
        "tenant": spec.tenant,
        "scopes": sorted(spec.scopes),
        "models": sorted(spec.models),
        "name": spec.name,
        "created_at": key.created_at,
        "expires_at": spec.expires_at or None,
        "state": key.refusal(time.time()) or "active",
        "rate_per_s": spec.rate_per_s,
        "burst": spec.burst,
        "max_in_flight": spec.max_in_flight,
    }


@click.group("keys")
def command() -> None:
    """API keys: tenant, scopes (submit, read, admin), models, expiry, limits."""


@command.command("create")
@click.option("--tenant", required=True, help="Owner of the jobs this key submits.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(SCOPES),
    default=("submit", "read"),
    show_default=True,
    help="Repeat for several; admin includes submit and read.",
)
@click.option("--model", "models", multiple=True, help="Allow only these models (repeat).")
@click.option("--expires-in", default=None, help="Lifetime, e.g. 30d or 12h (default: never).")
@click.option("--name", default="", help="A note shown by `list`.")
@click.option("--rate", type=float, default=None, help="Requests per second (default: settings).")
@click.option("--burst", type=int, default=None, help="Bucket size (default: settings).")
@click.option("--max-in-flight", type=int, default=None, help="Jobs queued or running at once.")
@click.option("--json", "as_json", is_flag=True, help="Print the key and its record as JSON.")
def create(
    tenant: str,
    scopes: tuple[str, ...],
    models: tuple[str, ...],
    expires_in: str | None,
    name: str,
    rate: float | None,
    burst: int | None,
    max_in_flight: int | None,
    as_json: bool,
) -> None:
    """Create a key and print it: this is the only time it is shown."""
    lifetime = _seconds(expires_in)
    spec = KeySpec(
        tenant=tenant,
        scopes=frozenset(scopes),
        models=frozenset(models),
        name=name,
        expires_at=time.time() + lifetime if lifetime else 0.0,
        rate_per_s=rate,
        burst=burst,
        max_in_flight=max_in_flight,
    )
    try:
        key, record = _run(lambda store: store.create(spec))
    except InvalidKeySpec as exc:
        raise click.BadParameter(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"key": key, **_describe(record)}))
        return
    click.echo(key)
    click.echo(
        f"key id {record.key_id}, tenant {tenant}: store the key now; it is not kept", err=True
    )


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_keys(as_json: bool) -> None:
    """Every key's id, tenant, scopes, models and state (never the key itself)."""
    for record in _run(lambda store: store.list()):
        described = _describe(record)
        if as_json:
            click.echo(json.dumps(described))
            continue
        models = ",".join(described["models"]) or "*"
        scopes = ",".join(described["scopes"])
        click.echo(
            f"{record.key_id}\t{described['tenant']}\t{scopes}\t{models}\t{described['state']}\t{described['name']}"
        )


@command.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key by id; every producer refuses it from the next request on."""
    if not _run(lambda store: store.revoke(key_id)):
        raise click.ClickException(f"no key with id {key_id}")
    click.echo(f"revoked {key_id}")
