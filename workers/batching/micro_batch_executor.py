"""Runs a micro-batch through the engine; when the engine raises, bisects the batch so only the
items that fail on their own fail, with the exception's type and message as their error. An
engine that died (`BatchEngine.dead`) fails nothing: EngineDied ends the loop, the micro-batch
left pending for another worker."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from shared.codec import dumps
from shared.job_store import stamp_ms
from workers.engines.base import BatchEngine, EngineDied, FailedJob

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineStart:
    """When an engine started on a micro-batch: the clock its `engine_ms` runs on, and the
    wall-clock ms its jobs' queue waits end at (a staged engine's micro-batch may wait for the
    device well after the worker read it)."""

    perf: float
    wall_ms: float

    @classmethod
    def now(cls) -> EngineStart:
        return cls(time.perf_counter(), stamp_ms())


@dataclass(slots=True)
class Outcome:
    output: dict[str, Any] | None
    error: dict[str, str] | None
    engine_ms: float
    batch_size: int
    batch_id: str
    ran_ms: float  # EngineStart.wall_ms
    written: str = ""  # `output` as the JSON text its job stores


def engine_calls(outcomes: list[Outcome]) -> list[Outcome]:
    """One outcome per engine call (a bisected micro-batch made several; its jobs share one)."""
    return list({outcome.batch_id: outcome for outcome in outcomes}.values())


async def execute(
    engine: BatchEngine, inputs: list[dict[str, Any]], device: Executor | None = None
) -> list[Outcome]:
    """Run a micro-batch, bisecting it on failure until each bad input fails alone. `device`:
    the thread a staged engine's `run` calls are confined to (StagePipeline's), else a worker
    thread of the loop's."""
    if not inputs:
        return []
    start = EngineStart.now()
    try:
        outputs = await _call(engine, inputs, device)
    except Exception as exc:
        # bisecting would fail every job, each through no fault of its own; asked off the loop
        # (the torch engine waits for its device) and, for a staged engine, on the device thread
        if await _on_engine_thread(engine, device, engine.dead):
            raise EngineDied(f"the engine died: {exc!r}") from exc
        if len(inputs) == 1:
            engine_ms = _ms_since(start.perf)
            return [Outcome(None, _error(exc), engine_ms, 1, uuid.uuid4().hex, start.wall_ms)]
        middle = len(inputs) // 2
        halves = (inputs[:middle], inputs[middle:])
        return [outcome for half in halves for outcome in await execute(engine, half, device)]
    return succeeded(inputs, outputs, start)


def _error(exc: Exception) -> dict[str, str]:
    """A job's error: the exception's type and message, a lone surrogate in it (a file name
    decoded with `surrogateescape`) escaped. JSON cannot hold one: as it was, it stopped the
    worker's consumer where the micro-batch was written back, every other job with it."""
    message = str(exc) or repr(exc)
    escaped = message.encode("utf-8", "backslashreplace").decode()
    return {"type": type(exc).__name__, "message": escaped}


def succeeded(
    inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], start: EngineStart
) -> list[Outcome]:
    """One engine call's outcomes: same batch id, size, start and engine time for every job.
    An output that is not a JSON object (bytes, a set, a string) fails its own job: it used to
    stop the worker's consumer where the batch was written back, every other job with it. So
    does a `FailedJob`, with its error."""
    engine_ms = _ms_since(start.perf)
    batch_id = uuid.uuid4().hex
    outcomes = []
    for output in outputs:
        outcome = Outcome(output, None, engine_ms, len(inputs), batch_id, start.wall_ms)
        if isinstance(output, FailedJob):
            outcome.output, outcome.error = None, _error(output.exc)
            outcomes.append(outcome)
            continue
        try:
            outcome.written = _stored(output)
        except (TypeError, ValueError) as exc:  # orjson's JSONEncodeError is a TypeError
            message = f"the engine's output cannot be stored as JSON: {exc}"
            outcome.output, outcome.error = None, {"type": "InvalidOutput", "message": message}
        outcomes.append(outcome)
    return outcomes


def _stored(output: Any) -> str:
    """`output` as the JSON text its job stores. A NaN or an infinity, as a value or a key, is
    refused as bytes are: orjson writes it as null, and the job succeeded with its numbers
    silently gone. Only an output whose text holds a null is searched for one, so a healthy
    output costs no walk."""
    if not isinstance(output, dict):
        raise TypeError(f"it is {type(output).__name__}, not an object of named outputs")
    written = dumps(output).decode()
    if "null" in written and (where := _non_finite(output, "")) is not None:
        raise ValueError(f"{where} is not a finite number (JSON has no NaN or infinity)")
    return written


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in `value` (a float, a numpy array or scalar, or
    dicts and lists of them), a dict's keys included, or None."""
    if isinstance(value, float | np.floating):
        return None if math.isfinite(value) else path
    if isinstance(value, np.ndarray):
        if value.dtype == object:  # written as its Python values (codec.py), floats among them
            return _non_finite(value.tolist(), path)
        if value.dtype.kind not in "fc" or np.isfinite(value).all():
            return None
        first = np.argwhere(~np.isfinite(value))[0]
        return path + "".join(f"[{i}]" for i in first)
    if isinstance(value, dict):
        if (key := _non_finite_key(value)) is not None:
            return f"{path} key {key}" if path else f"key {key}"
        items: Any = ((f"{path}.{key}" if path else str(key), v) for key, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((where for p, v in items if (where := _non_finite(v, p)) is not None), None)


def _non_finite_key(value: dict[Any, Any]) -> float | None:
    """A NaN or infinite key of `value`: orjson writes it as "null", so the job succeeded with
    the key gone (two such keys read as one)."""
    return next((key for key in value if isinstance(key, float) and not math.isfinite(key)), None)


async def _call(
    engine: BatchEngine, inputs: list[dict[str, Any]], device: Executor | None
) -> list[dict[str, Any]]:
    """One `infer`, on a list of its own (`engine_inputs`)."""
    outputs = await _on_engine_thread(engine, device, engine.infer, engine_inputs(inputs))
    return one_per_input(inputs, outputs)


def engine_inputs(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A list of its own for one engine call, each item a copy of its keys: an engine that
    takes its inputs off the list (`pop`) emptied the micro-batch's own, its outputs then
    counted against none; one that edits an item (takes its text off, writes its tokens in)
    left it so for its bisection's reruns, which failed the healthy jobs, and for the failed
    job's record of its inputs. The values inside are shared: a copy of them, whose cost grows
    with their size, would be paid by every call for a rare rerun's sake. An item that is no
    object (no producer sends one) is passed as it is, for the engine to fail its job."""
    return [dict(item) if isinstance(item, dict) else item for item in inputs]


async def _on_engine_thread(
    engine: BatchEngine, device: Executor | None, call: Callable[..., T], *args: Any
) -> T:
    """`call(*args)` where the engine runs: the staged engine's device thread, the loop itself
    for an `inline` engine, else a worker thread."""
    if device is not None:
        return await asyncio.get_running_loop().run_in_executor(device, engine_call, call, *args)
    if engine.inline:
        return engine_call(call, *args)
    return await asyncio.to_thread(engine_call, call, *args)


def engine_call(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, a StopIteration it raises (engine code's `next()` of an input's empty
    list) turned into a RuntimeError, as a generator's is: asyncio cannot set one on the future
    an executor's call completes, which never completed then, and the micro-batch, every job of
    it, hung until `queue.max_run_s` deemed the engine dead."""
    try:
        return call(*args)
    except StopIteration as exc:
        raise RuntimeError("the engine raised StopIteration") from exc


def one_per_input(
    inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`outputs`, after checking the engine returned exactly one per input."""
    if not isinstance(outputs, list | tuple):
        raise TypeError(f"engine returned {type(outputs).__name__}, not a list of outputs")
    if len(outputs) != len(inputs):
        raise RuntimeError(f"engine returned {len(outputs)} outputs for {len(inputs)} inputs")
    return outputs


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)
