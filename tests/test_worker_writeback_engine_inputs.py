"""An engine that takes its inputs off the list it is given (as a queue: `pop`) emptied the
micro-batch's own list: the output count no longer matched it, a healthy batch was bisected to
nothing, and a failed one's reruns saw the items it had left, so jobs went without an outcome
(the write-back's zip with the deliveries refused it). Each engine call gets its own list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.model_repository import ModelConfig
from workers.batching.micro_batch_executor import Outcome, execute
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import StagedBatchEngine

CONFIG = ModelConfig(name="queueing", kind="batch", backend="identity")


def _taken(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items taken off `inputs` one by one, raising at a bad one."""
    taken = []
    while inputs:
        item = inputs.pop(0)
        if item.get("bad"):
            raise ValueError(f"bad item {item['n']}")
        taken.append(item)
    return taken


class QueueingEngine(StagedBatchEngine):
    """Takes its inputs off the list it is given, in `prepare` (so in `infer` too)."""

    inline = True

    def load(self) -> None:
        pass

    def prepare(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _taken(inputs)

    def run(self, prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return prepared

    def finish(self, running: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"n": item["n"]} for item in running]


def _inputs(bad: set[int]) -> list[dict[str, Any]]:
    return [{"n": n, "bad": n in bad} for n in range(4)]


def _ends(outcomes: list[Outcome]) -> list[int | str]:
    """Each job's output `n`, or its error's type."""
    return [o.output["n"] if o.output else o.error["type"] if o.error else "?" for o in outcomes]


async def _staged(engine: StagedBatchEngine, inputs: list[dict[str, Any]]) -> list[Outcome]:
    """`inputs` as one micro-batch through the stage pipeline: its outcomes as written back."""
    pipeline = StagePipeline(engine)
    written: list[Outcome] = []

    async def done(outcomes: list[Outcome]) -> None:
        written.extend(outcomes)

    try:
        await pipeline.submit(inputs, done)
        await pipeline.drain()
    finally:
        pipeline.close()
    return written


# The two ways a micro-batch reaches an engine (tests/test_batch_exec_edges_r8_inputs.py too).
RUNS: dict[str, Callable[[StagedBatchEngine, list[dict[str, Any]]], Any]] = {
    "execute": execute,
    "staged": _staged,
}


@pytest.mark.parametrize("run", RUNS.values(), ids=list(RUNS))
@pytest.mark.parametrize(
    ("bad", "ends"),
    [(set(), [0, 1, 2, 3]), ({2}, [0, 1, "ValueError", 3])],
    ids=["healthy", "one-bad"],
)
async def test_an_engine_that_empties_its_input_list_still_ends_every_job(
    run: Callable[[QueueingEngine, list[dict[str, Any]]], Any],
    bad: set[int],
    ends: list[int | str],
) -> None:
    engine = QueueingEngine(CONFIG, "default", "")
    inputs = _inputs(bad)

    outcomes = await run(engine, inputs)

    assert _ends(outcomes) == ends
    assert inputs == _inputs(bad)  # the micro-batch's own list, as it was
