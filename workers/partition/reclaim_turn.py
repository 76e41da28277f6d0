"""Which partition of a worker process may run a reclaimed entry now: one at a time across all
of them. A reclaimed entry may hold the input that killed the last worker; run beside another
partition's reclaimed entry (a worker serving two models, or a model's canary variant), the
next crash counted a delivery against both, and an innocent job, killed twice by its
neighbour, reached `max_deliveries` and the dead letters. Alone, only the poison dies again.
A partition's fresh work is not held back: only other reclaims wait, for as long as the
entry in hand runs (a reclaimed generation's: its whole run)."""

from __future__ import annotations


class ReclaimTurn:
    def __init__(self) -> None:
        self._holder: object | None = None

    def take(self, owner: object) -> bool:
        """Whether `owner` may claim a reclaimed entry now: no other owner's is in flight
        (then `owner` holds the turn until it `release`s it)."""
        if self._holder is None:
            self._holder = owner
        return self._holder is owner

    def release(self, owner: object) -> None:
        """`owner`'s reclaimed entry, if any, is written back."""
        if self._holder is owner:
            self._holder = None
