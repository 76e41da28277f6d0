"""Stack-free: how a failing micro-batch is bisected so that only the inputs that fail on their
own fail, with their exception as the error, and every other input still gets its output."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from shared.model_repository import ModelConfig
from tests.fault_engine import FaultEngine, StagedFaultEngine
from workers.batching.micro_batch_executor import Outcome, execute
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import EngineDied


@pytest.fixture
def engine() -> FaultEngine:
    config = ModelConfig(name="faulty", kind="batch", backend="tests.fault_engine:FaultEngine")
    fault_engine = FaultEngine(config, "default", "")
    fault_engine.load()
    return fault_engine


def _inputs(n: int, bad: set[int]) -> list[dict[str, Any]]:
    return [
        {"n": i, "action": "raise", "tag": f"bad-{i}"} if i in bad else {"n": i} for i in range(n)
    ]


async def test_a_healthy_batch_is_one_engine_call(engine: FaultEngine) -> None:
    outcomes = await execute(engine, _inputs(8, bad=set()))
    assert [o.output["n"] for o in outcomes if o.output] == list(range(8))
    assert {o.batch_id for o in outcomes} == {outcomes[0].batch_id}
    assert {o.batch_size for o in outcomes} == {8}


async def test_one_bad_input_fails_alone_and_the_batch_is_halved_towards_it(
    engine: FaultEngine,
) -> None:
    outcomes = await execute(engine, _inputs(8, bad={5}))
    failed = [i for i, o in enumerate(outcomes) if o.error is not None]
    assert failed == [5]
    assert outcomes[5].error == {"type": "ValueError", "message": "poison item ['bad-5']"}
    assert outcomes[5].output is None
    assert [o.output["n"] for o in outcomes if o.output] == [0, 1, 2, 3, 4, 6, 7]
    # [0..7] fails -> [0..3] runs; [4..7] fails -> [4, 5] fails -> [4] runs, [5] fails; [6, 7] runs
    assert [o.batch_size for o in outcomes] == [4, 4, 4, 4, 1, 1, 2, 2]
    assert len({o.batch_id for o in outcomes}) == 4


async def test_bad_inputs_in_both_halves_each_fail_alone(engine: FaultEngine) -> None:
    outcomes = await execute(engine, _inputs(6, bad={0, 4}))
    assert [i for i, o in enumerate(outcomes) if o.error] == [0, 4]
    assert [(i, output["n"]) for i, output in _outputs(outcomes)] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (5, 5),
    ]


async def test_an_output_no_job_can_store_fails_its_own_job(engine: FaultEngine) -> None:
    """These stopped the worker's consumer where the micro-batch was written back (orjson's
    TypeError), and every other job of the worker with it."""
    outputs = [None, "bytes", "text", "set", None]
    outcomes = await execute(engine, [{"n": i, "output": o} for i, o in enumerate(outputs)])
    errors = [o.error["message"] if o.error else None for o in outcomes]
    assert errors == [
        None,
        "the engine's output cannot be stored as JSON: Type is not JSON serializable: bytes",
        "the engine's output cannot be stored as JSON: it is str, not an object of named outputs",
        "the engine's output cannot be stored as JSON: Type is not JSON serializable: set",
        None,
    ]
    assert {o.error["type"] for o in outcomes if o.error} == {"InvalidOutput"}
    assert [o.written for o in outcomes][::4] == [
        f'{{"n":{i},"output":null,"pid":{os.getpid()}}}' for i in (0, 4)
    ]
    assert [o.batch_size for o in outcomes] == [5] * 5  # one engine call: no bisection needed


async def test_a_nan_or_infinity_in_an_output_fails_its_own_job(engine: FaultEngine) -> None:
    """orjson writes a NaN or an infinity as null: the job succeeded with its numbers silently
    gone (an embedding of nulls). It fails alone now; an output's own nulls are kept."""
    outputs = [None, "nan", "inf", "nan-array"]
    outcomes = await execute(engine, [{"n": i, "output": o} for i, o in enumerate(outputs)])
    assert [o.error for o in outcomes] == [
        None,
        *(
            {
                "type": "InvalidOutput",
                "message": "the engine's output cannot be stored as JSON: "
                f"{where} is not a finite number (JSON has no NaN or infinity)",
            }
            for where in ("scores[1]", "logits.top", "embeddings[1][0]")
        ),
    ]
    assert outcomes[0].written == f'{{"n":0,"output":null,"pid":{os.getpid()}}}'


async def test_an_engine_that_returns_no_list_fails_with_what_it_returned(
    engine: FaultEngine,
) -> None:
    [outcome] = await execute(engine, [{"action": "no-list"}])
    assert outcome.error == {
        "type": "TypeError",
        "message": "engine returned NoneType, not a list of outputs",
    }


async def test_an_empty_batch_calls_nothing(
    engine: FaultEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    infer = engine.infer
    monkeypatch.setattr(engine, "infer", lambda inputs: calls.append(len(inputs)) or infer(inputs))
    assert await execute(engine, []) == []
    assert calls == []


def _outputs(outcomes: list[Outcome]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, o.output) for i, o in enumerate(outcomes) if o.output is not None]


async def test_a_staged_engine_that_died_is_raised_before_the_next_read(tmp_path: Path) -> None:
    """A staged micro-batch runs in the background, where EngineDied was kept until the next
    submit: on a partition no more jobs came to, the worker lived on, the dead micro-batch's
    entries held by no one running them."""
    config = ModelConfig(name="staged", kind="batch", backend="tests.fault_engine:FaultEngine")
    engine = StagedFaultEngine(config, "default", "")
    engine.load()
    pipeline = StagePipeline(engine)
    poisoned = tmp_path / "poisoned"
    poisoned.touch()
    written: list[list[Outcome]] = []

    async def done(outcomes: list[Outcome]) -> None:
        written.append(outcomes)

    try:
        await pipeline.submit([{"n": 1, "while": str(poisoned)}, {"n": 2}], done)
        while pipeline.in_flight:
            await asyncio.sleep(0.01)
        with pytest.raises(EngineDied):
            await pipeline.until_wanted()
    finally:
        pipeline.close()
    assert written == []  # no job failed for it: both left pending
