"""`conveyor routes show|set|reset MODEL`: read or change a model's live split between variants,
its shadows and its stickiness, or put config.yaml's back; every producer applies a change
within a second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from conveyor.client.admin_http import admin_call, clock
from conveyor.client.cli_options import connection_options, printable
from conveyor.client.option_pairs import option_pairs
from shared.canary_steps import WEIGHT_SLACK

MAX_HISTORY = 1000  # the most changes `GET /v1/models/{model}/routes?history=` answers
# What a `--weight` or `--shadow` value must be, said when one is not
PERCENT = "VARIANT=PERCENT (every number must be finite, in [0, 100])"
RATE = "VARIANT=RATE (every number must be finite, in [0, 1])"


def number_in(low: float, high: float) -> Callable[[str], float]:
    """A parser of numbers in [low, high], the producer's bounds: refused here, a `nan` or a
    negative weight was caught only once the routes had been read, so a producer that is down
    turned a usage error into an outage."""

    def number(text: str) -> float:
        value = float(text)
        if not low <= value <= high:  # False for nan
            raise ValueError(text)
        return value

    return number


def model_path(model: str, tail: str) -> str:
    """The admin path `/v1/models/MODEL/TAIL`, MODEL as one path segment."""
    from conveyor.client.calls import segment  # the SDK (httpx): not for `--help`

    return f"/v1/models/{segment(model)}/{tail}"


@click.group("routes")
def command() -> None:
    """Live routes of a model (needs an admin key)."""


def percent_text(percent: float, least: int = 0) -> str:
    """A percent with `least` decimals, or as many more as it takes to show it, up to the 6 of
    the routes' tolerance (WEIGHT_SLACK): with two, a 0.001 % canary step read 0.00 % beside a
    baseline of 100.00 %, and `:g`'s 6 digits read a 99.99999 % step as 100."""
    for decimals in range(least, 6):
        text = f"{percent:.{decimals}f}"
        if abs(float(text) - percent) < WEIGHT_SLACK / 10:  # float noise, as 0.07 * 100
            return text
    return f"{percent:.6f}"


def print_routes(view: dict[str, Any]) -> None:
    click.echo(f"{view['model']}  version {view['version']}  sticky by {view['sticky_by']}")
    for name, weight in sorted(view["weights"].items(), key=lambda kv: -kv[1]):
        click.echo(f"  {name:<20} {percent_text(weight, least=2):>6} %")
    for name, rate in view["shadows"].items():
        click.echo(f"  {name:<20} shadow, {percent_text(rate * 100)} % of online requests")
    for change in view.get("history", []):
        new = change["new"]
        weights = ", ".join(f"{k} {percent_text(v)}" for k, v in new["weights"].items())
        shadows = ", ".join(f"{k} {percent_text(v * 100)} %" for k, v in new["shadows"].items())
        click.echo(
            f"  v{change['version']} {clock(change['at'])} {change['by']}: {weights};"
            f" shadows {shadows or 'none'}; sticky by {new['sticky_by']}"
        )
    # why producers serve other routes than the stored ones (the history's last `new`): it was
    # the API's alone, so the CLI showed config.yaml's split over a log of another, unexplained
    if adjusted := view.get("adjusted"):
        click.echo(f"warning: {printable(adjusted)}", err=True)
    for warning in view.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


@command.command("show")
@click.argument("model")
@click.option(
    "--history",
    default=5,
    show_default=True,
    type=click.IntRange(0, MAX_HISTORY),
    help="How many past changes to show.",
)
@connection_options
def show(model: str, history: int, url: str | None, api_key: str | None) -> None:
    """Print the routes, their version and the latest changes."""
    print_routes(admin_call("GET", model_path(model, f"routes?history={history}"), url, api_key))


@command.command("set")
@click.argument("model")
@click.option("--weight", "weights", multiple=True, help="VARIANT=PERCENT; all must sum to 100.")
@click.option(
    "--shadow",
    "shadows",
    multiple=True,
    help="VARIANT=RATE (0..1); the shadows not given stay as now.",
)
@click.option("--no-shadows", is_flag=True, help="Stop every shadow.")
@click.option("--sticky-by", type=click.Choice(["routing_key", "tenant"]), help="Default: as now.")
@connection_options
def set_routes(
    model: str,
    weights: tuple[str, ...],
    shadows: tuple[str, ...],
    no_shadows: bool,
    sticky_by: str | None,
    url: str | None,
    api_key: str | None,
) -> None:
    """Replace the routes (what is not given stays as it is) and print the new ones."""
    if shadows and no_shadows:  # --no-shadows dropped the --shadow given beside it, silently
        raise click.UsageError("give --shadow or --no-shadows, not both")
    if not (weights or shadows or no_shadows or sticky_by):  # a new version changing nothing
        raise click.UsageError(
            "nothing to set: give --weight, --shadow, --no-shadows or --sticky-by"
        )
    new_weights = option_pairs(weights, "--weight", PERCENT, number_in(0, 100))
    new_shadows = option_pairs(shadows, "--shadow", RATE, number_in(0, 1))
    current = admin_call("GET", model_path(model, "routes?history=0"), url, api_key)
    # the shadows kept as they are, but those the new weights give traffic: a variant cannot
    # both serve and shadow, and weighting a shadow was a 422 short of --no-shadows, which
    # dropped every other shadow too; a --shadow changes its own rate alone (it replaced them
    # all, so retuning one shadow silently stopped the others)
    kept = {name: rate for name, rate in current["shadows"].items() if not new_weights.get(name)}
    body = {
        "weights": new_weights or current["weights"],
        "shadows": {} if no_shadows else kept | new_shadows,
        "sticky_by": sticky_by or current["sticky_by"],
        "expected_version": current["version"],
    }
    view = admin_call("PUT", model_path(model, "routes"), url, api_key, body)
    print_routes({**view, "history": view["history"][-1:]})


@command.command("reset")
@click.argument("model")
@click.option(
    "--expected-version",
    type=click.IntRange(min=0),
    help="Refuse unless the routes are still at this version (see `routes show`).",
)
@connection_options
def reset(model: str, expected_version: int | None, url: str | None, api_key: str | None) -> None:
    """Put config.yaml's routes back (a new version, logged) and print them."""
    path = model_path(model, "routes")
    if expected_version is not None:
        path += f"?expected_version={expected_version}"
    view = admin_call("DELETE", path, url, api_key)
    print_routes({**view, "history": view["history"][-1:]})
