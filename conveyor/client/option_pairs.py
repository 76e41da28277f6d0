"""Repeatable `NAME=VALUE` options (`--metadata`, `--weight`, `--shadow`) as one mapping."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

V = TypeVar("V")


def option_pairs(
    values: tuple[str, ...], hint: str, expected: str, value_of: Callable[[str], V]
) -> dict[str, V]:
    """Each `NAME=VALUE` in `values`, its value made by `value_of` (a ValueError refuses it as
    not `expected`). A name given twice is refused: the last would win silently, so a fixed typo
    beside the original would send the wrong value."""
    pairs: dict[str, V] = {}
    twice = set()
    for value in values:
        name, sep, text = value.partition("=")
        try:
            made = value_of(text)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise click.BadParameter(f"{value!r}: expected {expected}", param_hint=hint)
        if name in pairs:
            twice.add(name)
        pairs[name] = made
    if twice:
        raise click.BadParameter(
            f"{', '.join(sorted(twice))} given more than once", param_hint=hint
        )
    return pairs
