"""`conveyor keys create|rotate|list|revoke`: manage the API keys the producer accepts. A key is
printed once, at creation; Redis keeps only its SHA-256. `conveyor keys webhook-secret` prints
the key a tenant's webhook receiver verifies deliveries with."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from shared.api_key_scopes import SCOPES
from shared.keys import Keys
from shared.redis_clock import CLOCK, adopt_redis_clock
from shared.webhook_signing import OPERATOR, owner_secret

# The key store, Redis, the settings and the model repository are imported in the functions that
# use them: `conveyor keys --help` and a usage error need none of them.
if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from shared.api_keys import ApiKey, ApiKeyStore, KeySpec
    from shared.settings import Settings

T = TypeVar("T")
# What `_confirmed` says of a write its replicas did not confirm ({}: how they fell short).
KEY_BACK = (
    "the revocation is not confirmed ({}): a failover now could bring the key back; run this"
    " again (it is harmless to repeat)"
)
NEW_KEY_LOST = (
    "the new key is not confirmed ({}): a failover now could lose it, so it is not shown; run"
    " this again (its record, never shown, can be revoked: `conveyor keys list`)"
)
# What a rotation with `--revoke-old-in` adds to NEW_KEY_LOST: its script ran on the primary, so
# the old key's end is written there all the same (a rerun, whose cutoff is later, leaves it).
OLD_KEY_CUT = "; key id {} works on {} all the same (its end was written with the new key)"
# What `dev_key` says when too few replicas confirmed its key's write (or an old key's revoke):
# `conveyor up` said Redis was lost, though a single-node stack only needs acks off.
DEV_KEY_UNCONFIRMED = (
    "no replica confirmed the development key ({}): set CONVEYOR_REPLICA_ACKS=0 for a"
    " single-node dev stack, or add replicas"
)
DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest lifetime or grace given (100 years): `--expires-in 99999999999999999999d` made a
# key listed as expiring `8.64e+27 (Unix time)`, a lifetime no one meant
MAX_LIFETIME_S = 36_500 * 86_400


def dev_key_spec() -> KeySpec:
    """The development key's spec (its tenant and name pick out earlier ones to revoke): built
    when asked, since KeySpec's module imports Redis and the settings, which help needs not."""
    from shared.api_keys import KeySpec

    return KeySpec(tenant="dev", scopes=frozenset(SCOPES), name="development key (conveyor up)")


def _run(action: Callable[[ApiKeyStore], Awaitable[T]]) -> T:
    """`action` on the store, on Redis's clock (`_on_redis_clock`)."""
    from conveyor.local_stack import with_redis

    async def on(client: aioredis.Redis, settings: Settings) -> T:
        return await action(await _on_redis_clock(client, settings))

    return with_redis(on)


async def _on_redis_clock(client: aioredis.Redis, settings: Settings) -> ApiKeyStore:
    """The store, with this process's clock corrected to Redis's first (one TIME), as a
    producer's is: a key's times written from an operator's laptop a minute off were a minute
    off on every producer (its expiry, its rotation's grace), and its state read so."""
    from shared.api_keys import ApiKeyStore

    await adopt_redis_clock(client)
    return ApiKeyStore(client, Keys(settings.key_prefix))


def dev_key(settings: Settings, key_file: Path) -> str:
    """The development key `conveyor up` prints and keeps in `key_file` (mode 0600):
    CONVEYOR_DEV_API_KEY if set (so scripts can use a known key), else the previous run's key
    while Redis still accepts it, else a fresh one. Every other development key is revoked, so
    repeated `make up` leaves one admin key active, not one more each time."""
    import asyncio

    from shared.redis_client import connect

    previous = key_file.read_text().strip() if key_file.exists() else ""

    async def choose() -> str:
        client = connect(settings.redis_url, blocks_ms=0)
        try:
            store = await _on_redis_clock(client, settings)
            chosen = _only_dev_key(store, settings.dev_api_key, previous)
            return await _confirmed(chosen, DEV_KEY_UNCONFIRMED)
        finally:
            await client.aclose()

    key = asyncio.run(choose())
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)  # touch sets no mode on a file already there, maybe wider
    key_file.write_text(key + "\n")
    return key


async def _only_dev_key(store: ApiKeyStore, chosen: str, previous: str) -> str:
    """The development key, stored, with every other one revoked."""
    from shared.api_keys import key_id_of

    key = await _dev_key(store, chosen, previous)
    await _revoke_dev_keys_but(store, key_id_of(key))
    return key


async def _dev_key(store: ApiKeyStore, chosen: str, previous: str) -> str:
    """A chosen key that was revoked stays revoked: storing it again (every `conveyor up` with
    the same CONVEYOR_DEV_API_KEY) brought it back to life, a leaked key with it."""
    from shared.api_keys import InvalidKeySpec

    if chosen and (record := await store.verify(chosen)) is not None and record.revoked_at:
        raise click.ClickException(
            f"CONVEYOR_DEV_API_KEY names key {record.key_id}, which was revoked; choose another"
        )
    if not chosen and previous:
        record = await store.verify(previous)
        if record is not None and record.refusal(CLOCK.now()) is None:
            return previous
    try:
        key, _ = await store.create(dev_key_spec(), chosen or None)
    except InvalidKeySpec as exc:  # a traceback from `conveyor up`; the value is not repeated
        raise click.ClickException(f"CONVEYOR_DEV_API_KEY is not a usable key: {exc}") from None
    return key


async def _revoke_dev_keys_but(store: ApiKeyStore, key_id: str) -> None:
    now, dev = CLOCK.now(), dev_key_spec()
    for record in await store.list():
        is_dev = record.spec.name == dev.name and record.spec.tenant == dev.tenant
        if is_dev and record.key_id != key_id and record.refusal(now) is None:
            await store.revoke(record.key_id)


def _seconds(duration: str | None, hint: str = "--expires-in") -> float:
    """The seconds of a duration option (`hint`: its name in errors); 0 when not given."""
    if duration is None:
        return 0.0
    match = DURATION.fullmatch(duration)
    if match is None:
        raise click.BadParameter("use a number and a unit: 90s, 30m, 12h, 30d", param_hint=hint)
    # more digits than Python parses into an int (4300) were a ValueError's traceback
    digits = match[1].lstrip("0") or "0"
    if len(digits) > 12 or int(digits) * _UNITS[match[2]] > MAX_LIFETIME_S:
        never = f"; leave {hint} out for a key that never expires" if hint == "--expires-in" else ""
        raise click.BadParameter(f"at most 36500d (100 years){never}", param_hint=hint)
    seconds = float(int(digits) * _UNITS[match[2]])
    if seconds == 0:  # an expiry of 0 is stored as "never": refuse it rather than invert it
        raise click.BadParameter("a lifetime must be longer than 0", param_hint=hint)
    return seconds


def _expiry(lifetime: float, old: ApiKey | None = None) -> float:
    """When a key made now expires (0: never): in `lifetime` seconds when given, else a rotated
    key lives as long as the key it replaces did, so a rotation keeps a key's lifetime policy."""
    if not lifetime and old is not None:
        lifetime = old.lifetime_s
    return CLOCK.now() + lifetime if lifetime else 0.0


def _warn_unknown(models: tuple[str, ...]) -> None:
    """A mistyped `--model` makes a key that is refused everywhere: say so. Only a warning, since
    keys may be made from a machine without the deployment's model repository, or ahead of a
    model's rollout."""
    from shared.model_repository import ModelConfigError, ModelRepository
    from shared.settings import get_settings

    root = get_settings().model_repository
    try:
        served = ModelRepository.load(root).models
    except ModelConfigError:
        return
    if unknown := sorted(set(models) - set(served)):
        known = sorted(set(models) & set(served))
        usable = f"only {', '.join(known)}" if known else "no model"
        click.echo(
            f"warning: {', '.join(unknown)} not in the model repository {root}; this key may "
            f"use {usable} there",
            err=True,
        )


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
        "state": _state(key, CLOCK.now()),
        "rate_per_s": spec.rate_per_s,
        "burst": spec.burst,
        "max_in_flight": spec.max_in_flight,
        "max_streams": spec.max_streams,
        "weight": spec.weight,
        "limits_of": key.limits_of or None,
    }


def _state(key: ApiKey, now: float) -> str:
    """`active`, `revoked` or `expired`: a token a script can match, where the auth refusal's
    message (`API key revoked`) was shown. Revoked first, as the refusal says."""
    if key.refusal(now) is None:
        return "active"
    return "revoked" if key.revoked_at else "expired"


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
@click.option("--max-streams", type=int, default=None, help="Job-event streams open at once.")
@click.option(
    "--weight",
    type=float,
    default=1.0,
    show_default=True,
    help="The tenant's share in fair queuing (a positive number, at most 1000).",
)
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
    max_streams: int | None,
    weight: float,
    as_json: bool,
) -> None:
    """Create a key and print it: this is the only time it is shown."""
    from shared.api_keys import InvalidKeySpec, KeySpec

    lifetime = _seconds(expires_in)
    spec = KeySpec(
        tenant=tenant,
        scopes=frozenset(scopes),
        models=frozenset(models),
        name=name,
        rate_per_s=rate,
        burst=burst,
        max_in_flight=max_in_flight,
        max_streams=max_streams,
        weight=weight,
    )

    def created(store: ApiKeyStore) -> Awaitable[tuple[str, ApiKey]]:
        """Its expiry from now on Redis's clock, read once the store has measured it."""
        timed = replace(spec, expires_at=_expiry(lifetime))
        return _confirmed(store.create(timed), NEW_KEY_LOST)

    try:
        key, record = _run(created)
    except InvalidKeySpec as exc:
        raise click.BadParameter(str(exc)) from None
    _warn_unknown(models)
    _show(key, record, as_json)


def _show(key: str, record: ApiKey, as_json: bool) -> None:
    """Print a new key, the only time it is shown."""
    if as_json:
        click.echo(json.dumps({"key": key, **_describe(record)}))
        return
    click.echo(key)
    click.echo(
        f"key id {record.key_id}, tenant {record.spec.tenant}: store the key now; it is not kept",
        err=True,
    )


async def _rotated(
    store: ApiKeyStore, key_id: str, lifetime: float, grace: float
) -> tuple[str, ApiKey, float]:
    """The new key replacing `key_id`, its record, and when the old key stops working (0: not
    before it is revoked). Refused for a key that is unknown or no longer usable, which the
    store checks in the step that writes the new key: a replacement for a revoked (maybe
    leaked) key would bring its access back. With `grace`, the old key stops working that many
    seconds from now (or sooner, at its own expiry)."""
    from shared.api_keys import KEY_ID, KeyNotRotatable

    old = await store.get(key_id) if KEY_ID.fullmatch(key_id) else None
    if old is None:
        raise click.ClickException(f"no key with id {key_id}")
    cutoff = CLOCK.now() + grace if grace else 0.0
    ends = min((t for t in (old.spec.expires_at, cutoff) if t), default=0.0)
    # the cutoff is written with the new key: replicas short of it, the old key's end stands
    unconfirmed = NEW_KEY_LOST + (OLD_KEY_CUT.format(key_id, _until(ends)) if grace else "")
    try:
        rotating = store.rotate(old, _expiry(lifetime, old), cutoff)
        key, record = await _confirmed(rotating, unconfirmed)
    except KeyNotRotatable as exc:
        raise click.ClickException(
            f"{exc}: create a new key instead (`conveyor keys create`)"
        ) from None
    return key, record, ends


def _until(ends: float) -> str:
    """When a key stops working, in words (`ends`: Unix seconds, 0: never)."""
    if not ends:
        return "until revoked (`conveyor keys revoke`)"
    return f"until {_utc(ends)}"


@command.command("rotate")
@click.argument("key_id")
@click.option(
    "--expires-in", default=None, help="Lifetime, e.g. 30d (default: the old key's lifetime)."
)
@click.option(
    "--revoke-old-in",
    default=None,
    help="Keep KEY_ID working this long, e.g. 24h, to roll clients over (default: until revoked).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the key and its record as JSON.")
def rotate(key_id: str, expires_in: str | None, revoke_old_in: str | None, as_json: bool) -> None:
    """Create a key that replaces KEY_ID and print it once: the same tenant, scopes, models and
    limits, which both keys share (a rotation does not double the tenant's capacity). KEY_ID
    works on until revoked (`conveyor keys revoke`) or expired, or for --revoke-old-in."""
    lifetime = _seconds(expires_in)
    grace = _seconds(revoke_old_in, "--revoke-old-in")
    key, record, ends = _run(lambda store: _rotated(store, key_id, lifetime, grace))
    _show(key, record, as_json)
    click.echo(f"key id {key_id} works on {_until(ends)}", err=True)


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_keys(as_json: bool) -> None:
    """Every key's id, tenant, scopes, models, state, name, rotation link and expiry (never the
    key itself)."""
    records = _run(lambda store: store.list())
    now = CLOCK.now()  # Redis's, measured by `_run`
    for record in records:
        described = _describe(record)
        if as_json:
            click.echo(json.dumps(described))
            continue
        models = ",".join(described["models"]) or "*"
        scopes = ",".join(described["scopes"])
        # a rotated key's link and an expiring key's time follow the name, each named as it
        # reads, so the name stays the sixth column (a rotation's `--revoke-old-in` was told
        # nowhere but `--json`)
        link = f"\tlimits of {record.limits_of}" if record.limits_of else ""
        ends = record.spec.expires_at
        expiry = f"\t{'expired' if ends <= now else 'expires'} {_utc(ends)}" if ends else ""
        click.echo(
            f"{record.key_id}\t{described['tenant']}\t{scopes}\t{models}\t{described['state']}"
            f"\t{described['name']}{link}{expiry}"
        )


def _utc(at: float) -> str:
    """Unix seconds as UTC to the second, as `rotate` and `list` show a key's end; one past
    what a date holds (year 9999: `--expires-in 99999999d`) as the seconds, which ended `list`
    with a traceback for every key."""
    try:
        return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{at:g} (Unix time)"


async def _revoked(store: ApiKeyStore, given: str) -> str | None:
    """The id of the key revoked: `given` is its id or the key itself (an operator holding a
    leaked key need not work out its id); None when it names no stored key. An id that names
    none may be a key itself: a chosen development key of 16 hex digits looks like an id. A
    key's id is derived from the key, not read from its record: one whose record is corrupt
    (which `verify` refuses) is revoked by the key too."""
    from shared.api_keys import KEY_ID, key_id_of

    if KEY_ID.fullmatch(given) and await store.revoke(given):
        return given
    key_id = key_id_of(given)
    return key_id if await store.revoke(key_id) else None


async def _confirmed(writing: Awaitable[T], unconfirmed: str = KEY_BACK) -> T:
    """A write's outcome, refused in words of its own where the replicas fell short (not as a
    Redis out of reach): written on the primary, a failover could still undo it."""
    from shared.redis_client import ReplicaAckTimeout

    try:
        return await writing
    except ReplicaAckTimeout as exc:
        raise click.ClickException(unconfirmed.format(exc)) from None


@command.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key by id (or by the key itself); every producer refuses it from the next
    request on. With CONVEYOR_REPLICA_ACKS, only once that many replicas hold the revocation."""
    from shared.api_keys import KEY_ID

    revoked = _run(lambda store: _confirmed(_revoked(store, key_id)))
    if revoked is None and KEY_ID.fullmatch(key_id):
        raise click.ClickException(f"no key with id {key_id}")
    if revoked is None:  # not repeated: what was given may be a key, into a terminal or a log
        raise click.ClickException(
            "no such key: give its id (16 hex digits, as `conveyor keys list` shows) or the key"
        )
    click.echo(f"revoked {revoked}")


@command.command("webhook-secret")
@click.option("--tenant", default=None, help="The tenant whose receivers verify with the key.")
@click.option("--operator", is_flag=True, help="The key of the operator's own (canary) events.")
def webhook_secret(tenant: str | None, operator: bool) -> None:
    """Print the key that signs one tenant's webhook deliveries (derived from
    CONVEYOR_WEBHOOK_SECRET, which no receiver needs): give it to that tenant only."""
    from shared.api_keys import TENANT
    from shared.settings import get_settings

    if operator == (tenant is not None):
        raise click.UsageError("give one of --tenant NAME or --operator")
    if tenant is not None and not TENANT.fullmatch(tenant):
        raise click.BadParameter(f"must match {TENANT.pattern}", param_hint="--tenant")
    secret = get_settings().webhook_secret
    if not secret:
        raise click.ClickException("CONVEYOR_WEBHOOK_SECRET is not set: webhooks are disabled")
    click.echo(owner_secret(secret, OPERATOR if operator else str(tenant)))
