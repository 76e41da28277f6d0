"""A refusal's problems on one line: the first few named, the rest counted. One for each of
20,000 wrong chat messages made a 580 kB body's 400 2.8 MB, and a replay of 10,000 dead letters
logged every id on one line."""

from __future__ import annotations

from collections.abc import Sequence

LISTED_PROBLEMS = 10


def listed(problems: Sequence[str], sep: str = "; ") -> str:
    """The first LISTED_PROBLEMS of `problems` joined by `sep`, then how many more there are."""
    more = len(problems) - LISTED_PROBLEMS
    shown = sep.join(problems[:LISTED_PROBLEMS])
    return f"{shown}{sep}and {more} more" if more > 0 else shown
