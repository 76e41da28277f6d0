"""What the stage pipeline does for any staged engine (PyTorch, ONNX Runtime), traced on two
micro-batches submitted back to back: the device stage of the first cannot end before the second
has been tokenised, so tokenising waits for no device run."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from shared.job_store import now_ms
from workers.batching.micro_batch_executor import Outcome
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.base import StagedBatchEngine


@dataclass
class StageTrace:
    overlapped: list[bool] = field(default_factory=list)  # per device run: next one tokenised?
    threads: dict[str, set[str]] = field(
        default_factory=lambda: {"prepare": set(), "run": set(), "finish": set()}
    )
    outcomes: dict[int, list[Outcome]] = field(default_factory=dict)
    run_ended_ms: list[int] = field(default_factory=list)  # wall clock, per device run

    def errors(self) -> list[list[dict[str, str] | None]]:
        return [[o.error for o in self.outcomes[n]] for n in sorted(self.outcomes)]


async def trace_two_micro_batches(
    engine: StagedBatchEngine, monkeypatch: pytest.MonkeyPatch
) -> StageTrace:
    """With tokenising on the device's critical path (after its run, or on its thread) a device
    run would wait out its timeout and record False."""
    trace = StageTrace()
    tokenised_next = threading.Event()
    prepare, run, finish = engine.prepare, engine.run, engine.finish

    def on_thread(stage: str) -> None:
        trace.threads[stage].add(threading.current_thread().name)

    def preparing(inputs: list[dict[str, Any]]) -> Any:
        on_thread("prepare")
        prepared = prepare(inputs)
        if inputs[0]["texts"] == ["the next micro-batch"]:
            tokenised_next.set()
        return prepared

    def running(prepared: Any) -> Any:
        on_thread("run")
        trace.overlapped.append(tokenised_next.wait(timeout=30))
        running = run(prepared)
        trace.run_ended_ms.append(now_ms())
        return running

    def finishing(running: Any) -> list[dict[str, Any]]:
        on_thread("finish")
        return finish(running)

    monkeypatch.setattr(engine, "prepare", preparing)
    monkeypatch.setattr(engine, "run", running)
    monkeypatch.setattr(engine, "finish", finishing)

    async def keep(n: int, result: list[Outcome]) -> None:
        trace.outcomes[n] = result

    pipeline = StagePipeline(engine)
    try:
        await pipeline.submit([{"texts": ["the first micro-batch"]}], partial(keep, 0))
        await pipeline.submit([{"texts": ["the next micro-batch"]}], partial(keep, 1))
        await pipeline.drain()
    finally:
        pipeline.close()
    return trace
