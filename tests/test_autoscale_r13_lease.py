"""`conveyor autoscale`'s lease within one tick, on a real Valkey: a tick that outlasted its
pool's lease (a frozen Redis, a slow look at a worker, a slow spawn) acted on a lease it had
renewed at its start, while another autoscaler had taken the pool meanwhile, and both scaled it:
twice its max, or a former leader that kept its workers beside the new one's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis

from autoscaling.local_autoscaler import PoolScaler
from tests.test_local_autoscaler import Ledger, _queue, _scaler


@dataclass
class StallingLedger(Ledger):
    """Stand-in workers whose `stall_in`-th call from now (a look at one or a start, counted
    together) stalls past the pool's lease: meanwhile `stall` runs."""

    stall_in: int = 0
    stall: Callable[[], object] = field(default=lambda: None)

    def start(self, name: str) -> str:
        self._call()
        return super().start(name)

    def alive(self, name: str) -> bool:
        self._call()
        return super().alive(name)

    def _call(self) -> None:
        self.stall_in -= 1
        if self.stall_in == 0:
            self.stall()


def _taken_over(client: redis.Redis, leader: PoolScaler, rival: PoolScaler) -> Callable[[], None]:
    """The leader's lease lapses, and `rival` takes the pool and scales it."""

    def lapse() -> None:
        client.delete(leader.lease_key)  # as if the lease had run out
        rival.tick(client, now=1.0)
        assert rival.leading

    return lapse


@pytest.mark.parametrize(
    ("queued", "then", "stall_in"),
    [(64, 256, 1), (0, 256, 2), (256, 0, 1)],
    ids=["a-look-then-a-scale-up", "a-spawn-amid-a-scale-up", "a-look-then-a-scale-down"],
)
def test_a_leader_whose_lease_lapsed_mid_tick_scales_no_more(
    redis_client: redis.Redis, queued: int, then: int, stall_in: int
) -> None:
    """The leader's tick stalls past its lease and another autoscaler scales the pool meanwhile:
    the leader started the rest of its scale-up beside the new leader's max (or stopped one
    worker and kept the others). It finds the lease gone before it starts or stops any, and
    steps aside at once: every worker it had is stopped."""
    ledger, rival_ledger = StallingLedger(), Ledger()
    leader = _scaler(ledger, window_s=0.0, cooldown_s=0.0)
    rival = _scaler(rival_ledger)
    _queue(redis_client, queued)
    leader.tick(redis_client, now=0.0)
    _queue(redis_client, then)
    ledger.stall_in, ledger.stall = stall_in, _taken_over(redis_client, leader, rival)
    assert leader.tick(redis_client, now=1.0) == 0
    assert not leader.leading and not leader.workers
    assert sorted(ledger.stopped) == sorted(ledger.started)
    assert len(rival.workers) == len(rival_ledger.started) == (4 if then else 0)
