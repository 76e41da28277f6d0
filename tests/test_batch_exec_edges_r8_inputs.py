"""Stack-free: what an engine does to the items it is given, or raises, stays in its own call.
An engine that edited its items (took a field off with `pop`, wrote its tokens into one) left
them so: a failed micro-batch's bisection reran its healthy jobs on what the edit left, and they
failed too. An error whose message JSON cannot hold (a lone surrogate, as a file name decoded
with `surrogateescape` has) stopped the worker's consumer where the micro-batch was written
back, every other job with it. A KeyboardInterrupt or a SystemExit is no job's failure: it ends
the loop, as it ends any program."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.codec import dumps, loads
from shared.model_repository import ModelConfig
from tests.test_worker_writeback_engine_inputs import RUNS
from workers.batching.micro_batch_executor import execute
from workers.engines.base import BatchEngine, StagedBatchEngine

CONFIG = ModelConfig(name="editing", kind="batch", backend="tests.unused:Tokens")
UNDECODABLE = b"caf\xe9.txt".decode(errors="surrogateescape")


class Tokens(StagedBatchEngine):
    """Takes each item's text off it and writes its tokens in its place, in `prepare` (so in
    `infer` too); a text naming a file it cannot read raises with the name in its message."""

    def load(self) -> None:
        """Nothing to load."""

    def prepare(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for item in inputs:
            if item["text"] == "poison":
                raise ValueError("poison text")
            if item["text"] == "file":
                raise OSError(f"cannot read {UNDECODABLE}")
            item["tokens"] = item.pop("text").split()
        return inputs

    def run(self, prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return prepared

    def finish(self, running: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"tokens": item["tokens"]} for item in running]


def _jobs() -> list[dict[str, Any]]:
    return [{"text": "a b"}, {"text": "c"}, {"text": "poison"}, {"text": "d e f"}]


@pytest.mark.parametrize("run", RUNS.values(), ids=list(RUNS))
async def test_an_engine_that_edits_its_items_leaves_the_reruns_the_jobs_as_sent(
    run: Callable[[Tokens, list[dict[str, Any]]], Any],
) -> None:
    jobs = _jobs()

    outcomes = await run(Tokens(CONFIG, "default", ""), jobs)

    assert [o.output or o.error for o in outcomes] == [
        {"tokens": ["a", "b"]},
        {"tokens": ["c"]},
        {"type": "ValueError", "message": "poison text"},
        {"tokens": ["d", "e", "f"]},
    ]
    assert jobs == _jobs()  # what a failed job's record shows it was given


@pytest.mark.parametrize("run", RUNS.values(), ids=list(RUNS))
async def test_an_error_json_cannot_hold_as_it_is_is_stored_escaped(
    run: Callable[[Tokens, list[dict[str, Any]]], Any],
) -> None:
    outcomes = await run(Tokens(CONFIG, "default", ""), [{"text": "file"}, {"text": "a"}])

    assert loads(dumps(outcomes[0].error)) == {
        "type": "OSError",
        "message": "cannot read caf\\udce9.txt",
    }
    assert outcomes[1].output == {"tokens": ["a"]}


class Interrupted(BatchEngine):
    """Raises what it is built with on a micro-batch holding a `stop` item."""

    def __init__(self, stop: BaseException) -> None:
        super().__init__(CONFIG, "default", "")
        self.stop = stop
        self.calls = 0

    def load(self) -> None:
        """Nothing to load."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        if any(item.get("stop") for item in inputs):
            raise self.stop
        return inputs


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(5)], ids=type)
async def test_an_interrupt_or_exit_is_raised_not_failed_as_a_job(stop: BaseException) -> None:
    engine = Interrupted(stop)

    with pytest.raises(type(stop)):
        await execute(engine, [{"n": 0}, {"stop": True}])

    assert engine.calls == 1  # not bisected
