"""Stack-free: what an engine call raises off the event loop reaches the loop as the job's
error, whatever it is. A StopIteration (engine code calling `next()` on an input's empty list)
cannot be set on an asyncio future: the call's future never completed, and its micro-batch, every
other job of it included, hung until `queue.max_run_s` deemed the engine dead and the worker
exited (forever with no ceiling)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from shared.codec import loads
from shared.model_repository import ModelConfig
from workers.batching.micro_batch_executor import Outcome, execute
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import StagedBatchEngine

CONFIG = ModelConfig(name="first", kind="batch", backend="tests.unused:FirstText")
JOBS = [{"texts": ["a", "b"]}, {"texts": []}, {"texts": ["c"]}]
STOP_ITERATION = {"type": "RuntimeError", "message": "the engine raised StopIteration"}


class FirstText(StagedBatchEngine):
    """Each job's first text, taken with `next()`: an empty list raises StopIteration in the
    host stage, as plain engine code does."""

    def load(self) -> None:
        """Nothing to load."""

    def prepare(self, inputs: list[dict[str, Any]]) -> list[str]:
        return [next(iter(item["texts"])) for item in inputs]

    def run(self, prepared: list[str]) -> list[str]:
        return prepared

    def finish(self, running: list[str]) -> list[dict[str, Any]]:
        return [{"first": text} for text in running]


def _results(outcomes: list[Outcome]) -> list[dict[str, Any] | None]:
    return [outcome.output or outcome.error for outcome in outcomes]


async def test_a_stop_iteration_on_an_engine_thread_fails_its_job_alone() -> None:
    outcomes = await asyncio.wait_for(execute(FirstText(CONFIG, "default", ""), JOBS), 5)
    assert _results(outcomes) == [{"first": "a"}, STOP_ITERATION, {"first": "c"}]


async def test_a_stop_iteration_in_a_staged_engines_stage_fails_its_job_alone() -> None:
    pipeline = StagePipeline(FirstText(CONFIG, "default", ""))
    written: list[list[Outcome]] = []

    async def done(outcomes: list[Outcome]) -> None:
        written.append(outcomes)

    try:
        await asyncio.wait_for(pipeline.submit(JOBS, done), 5)
        await asyncio.wait_for(pipeline.drain(), 5)
    finally:
        pipeline.close()
    assert [_results(outcomes) for outcomes in written] == [
        [{"first": "a"}, STOP_ITERATION, {"first": "c"}]
    ]


class ArrayViews(StagedBatchEngine):
    """Outputs as numpy gives them: a row of a transposed matrix and a column slice (views, not
    C-contiguous), a 0-d array (a torch scalar's `.numpy()`)."""

    def load(self) -> None:
        """Nothing to load."""

    def prepare(self, inputs: list[dict[str, Any]]) -> np.ndarray:
        return np.arange(len(inputs) * 3, dtype=np.float32).reshape(len(inputs), 3)

    def run(self, prepared: np.ndarray) -> np.ndarray:
        return prepared

    def finish(self, running: np.ndarray) -> list[dict[str, Any]]:
        return [
            {"column": running.T[i], "head": running[i, :2], "sum": np.array(running[i].sum())}
            for i in range(len(running))
        ]


async def test_numpy_views_and_scalars_are_stored_as_their_numbers() -> None:
    """orjson writes only C-contiguous arrays of numbers: a transposed row, a slice or a 0-d
    array failed its job `InvalidOutput` ("numpy array is not C contiguous")."""
    outcomes = await asyncio.wait_for(execute(ArrayViews(CONFIG, "default", ""), JOBS[:2]), 5)
    assert [outcome.error for outcome in outcomes] == [None, None]
    assert [loads(outcome.written) for outcome in outcomes] == [
        {"column": [0.0, 3.0], "head": [0.0, 1.0], "sum": 3.0},
        {"column": [1.0, 4.0], "head": [3.0, 4.0], "sum": 12.0},
    ]
