"""A worker refuses at start what would leave it serving nothing while it looks healthy; one
whose partition loop fails stops the others before it closes their engines."""

from __future__ import annotations

import asyncio

import pytest

from shared.model_repository import ModelConfigError
from shared.settings import Settings
from workers.runtime.consumer_runtime import ConsumerRuntime, run_together


def test_a_worker_told_to_serve_nothing_refuses_to_start() -> None:
    """Without CONVEYOR_MODELS a worker used to start, idle and report itself alive."""
    with pytest.raises(ModelConfigError, match=r"^CONVEYOR_MODELS is empty: name what this worker"):
        ConsumerRuntime(Settings(models=[]))
    with pytest.raises(ModelConfigError, match=r"^unknown model 'minlm'"):
        ConsumerRuntime(Settings(models=["minlm"]))


class _Loop:
    """A partition loop's contract with the runtime: `run` until `stopping` is set."""

    def __init__(self, fails: bool) -> None:
        self.stopping = asyncio.Event()
        self.fails = fails
        self.ran_to_its_stop = False

    async def run(self) -> None:
        if self.fails:
            await asyncio.sleep(0.01)
            raise RuntimeError("the engine died")
        await self.stopping.wait()
        await asyncio.sleep(0.01)  # the micro-batch in hand is written back
        self.ran_to_its_stop = True


async def test_a_loop_that_fails_stops_the_others_before_the_runtime_closes_anything() -> None:
    """asyncio.gather raised at the first failure and the engines were closed while the other
    partitions' loops ran on: their jobs failed with the closed engines' errors."""
    others, failing = [_Loop(False), _Loop(False)], _Loop(True)
    with pytest.raises(RuntimeError, match="the engine died"):
        await run_together([others[0], failing, others[1]])
    assert all(loop.ran_to_its_stop for loop in others)
