"""`conveyor canary start|status|abort MODEL`: roll a variant out step by step while its error
rate and p99 stay within bounds; the producers roll it back to 0 % the moment they don't."""

from __future__ import annotations

import re
from typing import Any

import click

from conveyor.client.admin_http import admin_call, clock
from conveyor.client.cli_options import connection_options
from conveyor.commands.routes import model_path, percent_text
from conveyor.finite_float import FiniteFloat
from shared.canary_steps import (
    INTERVAL_MAX_S,
    MAX_STEP_MAX_S,
    MAX_STEP_MIN_S,
    default_max_step_s,
    min_requests_refusal,
    steps_refusal,
)

DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_EVENTS = 500  # the most decisions `GET /v1/models/{model}/canary?events=` answers


def seconds(_ctx: click.Context, _param: click.Parameter, text: str | None) -> float | None:
    """A duration option's seconds; a callback, so a refusal names the option (`--interval`
    and `--max-step` take the same form)."""
    if text is None:
        return None
    match = DURATION.match(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r}: a duration like 60s, 5m or 500ms")
    return float(match[1]) * _UNITS[match[2] or "s"]


def _within(text: str | None, value: float | None, low: float, high: float, open_low: bool) -> None:
    """Refuse a duration outside the producer's bounds (shared/canary_steps.py), naming the
    option: `--max-step 10s` or `--interval 0s` went to the producer, whose 422 read as an
    outage (exit 1) while it was down."""
    if value is None or (low < value <= high) or (value == low and not open_low):
        return
    least = "more than" if open_low else "at least"
    raise click.BadParameter(f"{text!r}: {least} {low:g} s and at most {high:g} s")


def interval(ctx: click.Context, param: click.Parameter, text: str) -> float | None:
    """`--interval`'s seconds, within the producer's bounds for `interval_s`."""
    value = seconds(ctx, param, text)
    _within(text, value, 0.0, INTERVAL_MAX_S, open_low=True)
    return value


def max_step(ctx: click.Context, param: click.Parameter, text: str | None) -> float | None:
    """`--max-step`'s seconds, within the producer's bounds for `max_step_s`."""
    value = seconds(ctx, param, text)
    _within(text, value, MAX_STEP_MIN_S, MAX_STEP_MAX_S, open_low=False)
    return value


def steps(_ctx: click.Context, _param: click.Parameter, text: str) -> list[float]:
    """`--steps` as percents; a callback, so a refusal names the option. Held to the
    producer's rule (shared/canary_steps.py) here: a `nan` failed as the body was written,
    naming no option, and `-5`, `50,25` or `5,5.0000005` only at the producer, an outage's
    exit code when it was down."""
    try:
        percents = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        percents = []  # refused below, as no steps are
    if (why := steps_refusal(percents)) is not None:
        raise click.BadParameter(f"{text!r}: {why}")
    return percents


@click.group("canary")
def command() -> None:
    """Canary rollouts of a model's variants (needs an admin key)."""


def _p99_text(p99_ms: float | None) -> str:
    """A decision's p99 as read: none when too few online jobs were timed to judge it (the
    baseline's over a whole canary is never timed), which printed as `None ms`."""
    return "not judged" if p99_ms is None else f"{p99_ms} ms"


def print_canary(view: dict[str, Any], events: int) -> None:
    canary = view["canary"]
    if canary is None:
        click.echo("no canary")
        return
    click.echo(
        f"{canary['model']}:{canary['variant']} vs {canary['baseline']}: {canary['state']},"
        f" {percent_text(canary['weight'])} %"
        f" (steps {','.join(percent_text(s) for s in canary['steps'])})"
    )
    shown = view["events"]  # this rollout's alone: a canary's start drops the last one's
    for item in shown[max(len(shown) - events, 0) :]:  # not [-events:]: [-0:] is every one
        numbers = "".join(
            f"  {side} {seen['requests']} req, {percent_text(seen['error_rate'] * 100, 2)}% errors,"
            f" p99 {_p99_text(seen['p99_ms'])}"
            for side, seen in item.get("numbers", {}).items()
        )
        reason = f" ({item['reason']})" if item.get("reason") else ""
        at = clock(item["at"])
        click.echo(f"  {at} {item['type']} -> {percent_text(item['weight'])} %{reason}{numbers}")
    for warning in view.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


@command.command("start")
@click.argument("model")
@click.argument("variant")
@click.option(
    "--steps",
    "step_list",
    default="5,25,50,100",
    show_default=True,
    callback=steps,
    help="The variant's percents of traffic, one per step, ascending to at most 100.",
)
@click.option(
    "--interval", default="60s", show_default=True, callback=interval, help="Time per step."
)
@click.option(
    "--max-error-rate",
    default=0.01,
    show_default=True,
    type=FiniteFloat(min=0, max=1),  # the producer's bounds; unbounded, the help said x<=None
    help="How far the variant's error rate may exceed the baseline's before it rolls back.",
)
@click.option(
    "--max-p99-ms",
    default=500.0,
    show_default=True,
    type=FiniteFloat(min=0, min_open=True),
    help="The highest p99 (enqueue to result) of its online jobs before it rolls back.",
)
@click.option(
    "--min-requests",
    default=200,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests a step must see before its numbers are judged.",
)
@click.option(
    "--max-step",
    default=None,
    callback=max_step,
    help="How long a step may stay short of --min-requests before it rolls back"
    " (default: 5 intervals, at least 120s).",
)
@click.option("--baseline", default=None, help="Default: the model's default variant.")
@click.option("--webhook", default=None, help="URL that receives model.canary.* events.")
@connection_options
def start(
    model: str,
    variant: str,
    step_list: list[float],
    interval: float,
    max_error_rate: float,
    max_p99_ms: float,
    min_requests: int,
    max_step: float | None,
    baseline: str | None,
    webhook: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Start the canary and print it."""
    # the producer's rule (422), held here before any call: an outage's exit code otherwise
    bound_s = max_step or default_max_step_s(interval)
    if (why := min_requests_refusal(min_requests, bound_s)) is not None:
        raise click.BadParameter(why, param_hint="'--min-requests'")
    body = {
        "variant": variant,
        "steps": step_list,
        "interval_s": interval,
        "max_error_rate": max_error_rate,
        "max_p99_ms": max_p99_ms,
        "min_requests": min_requests,
        "max_step_s": max_step,
        "baseline": baseline,
        "webhook": webhook,
    }
    print_canary(admin_call("POST", model_path(model, "canary"), url, api_key, body), 5)


@command.command("status")
@click.argument("model")
@click.option(
    "--events",
    default=20,
    show_default=True,
    type=click.IntRange(0, MAX_EVENTS),
    help="How many decisions to show.",
)
@connection_options
def status(model: str, events: int, url: str | None, api_key: str | None) -> None:
    """Print the latest canary and its decisions with their numbers. The producer is asked for
    as many as shown: it answers 100 unless asked, so `--events 300` showed 100."""
    path = model_path(model, f"canary?events={max(events, 1)}")
    print_canary(admin_call("GET", path, url, api_key), events)


@command.command("abort")
@click.argument("model")
@connection_options
def abort(model: str, url: str | None, api_key: str | None) -> None:
    """Stop the running canary and put it back to 0 %."""
    print_canary(admin_call("DELETE", model_path(model, "canary"), url, api_key), 1)
