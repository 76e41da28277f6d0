"""How many jobs a micro-batch may take while tenants compete in a fair lane. Round robin decides
which jobs the next read takes, but a micro-batch is never preempted: a quiet tenant's job that
arrives while one runs waits for it. On a CPU a full micro-batch of an encoder runs several times
as long as a lone job waits on an idle pipeline (part F: ~13 ms for 8 minilm texts against 3-5
ms), so while round robin serves more than one tenant, micro-batches are sized to keep an engine
call within `queue.fair_batch_ms`, by additive increase and multiplicative decrease as Clipper's
adaptive batching does (Crankshaw et al., NSDI 2017): one job more after a full call within the
budget, a tenth fewer after a call over it, never fewer than one job per competing tenant:
round robin then serves every one of them each call, where at one job a call a quiet tenant got
every other call, and its own jobs queued once two calls took longer than it sends (part F on a
loaded CPU: its p99 wait went from 0.3 to 2.3 s). A GPU's full micro-batch fits any sensible
budget, so it never shrinks there; a tenant alone, flood or not, gets full ones."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from workers.partition.stream_reader import Delivery

# A tenant whose job round robin moved in counts as competing this long after it was read: a quiet
# tenant sends far less often than a micro-batch runs, and between its jobs it still competes.
COMPETING_S = 1.0
DECREASE = 0.9


class BatchBudget:
    def __init__(
        self,
        max_items: int,
        budget_ms: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_items = max_items
        self.budget_s = None if budget_ms is None else budget_ms / 1000.0
        self.clock = clock
        self.cap = max_items  # what a micro-batch may take while tenants compete
        self._moved: dict[str, float] = {}  # tenant -> when a job of it round robin moved was read

    def read(self, deliveries: Iterable[Delivery]) -> None:
        """Note the tenants of jobs round robin moved in (held jobs exist: the lane is fair and
        backlogged); a job added straight to the stream says nothing of competition."""
        if self.budget_s is None:
            return
        now = self.clock()
        for delivery in deliveries:
            if delivery.moved and delivery.entry is not None:
                self._moved[delivery.entry.tenant] = now

    def ran(self, size: int, engine_s: float) -> None:
        """An engine call of `size` jobs took `engine_s`: adjust the cap while tenants compete."""
        if self.budget_s is None or not self.competing():
            return
        if engine_s > self.budget_s:
            self.cap = max(self._least(), min(self.cap, int(size * DECREASE)))
        elif size >= self.cap:
            self.cap = min(self.max_items, self.cap + 1)

    def limit(self) -> int:
        """Jobs the next micro-batch may take."""
        return max(self.cap, self._least()) if self.competing() else self.max_items

    def _least(self) -> int:
        """One job per competing tenant (of those `competing` last counted)."""
        return min(self.max_items, len(self._moved))

    def competing(self) -> bool:
        """Whether round robin served more than one tenant within the last COMPETING_S."""
        if self.budget_s is None:
            return False
        since = self.clock() - COMPETING_S
        self._moved = {tenant: at for tenant, at in self._moved.items() if at >= since}
        return len(self._moved) > 1
