"""Benchmark part C's smoke test, apart from the other parts' (test_benchmarks_smoke.py): it
measures the session's smollm2 engine and the shared stack's smollm2 worker, which the LLM tests
start once (conftest), where `make bench`'s part C starts its own two, a minute or more here.
Its name sorts it after those tests, so it finds both running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks.llm_streaming import ENGINE, PIPELINE, measured
from benchmarks.report import machine, started_now, write_part, write_report
from benchmarks.scales import SMOKE
from conveyor.stack import Stack
from tests.test_benchmarks_smoke import check_common
from workers.engines.vllm_engine import VllmEngine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # run alone, it pays for both starts (the LLM tests' allowance)
]


async def test_part_c_llm_streaming(
    tmp_path: Path, smollm2_engine: VllmEngine, stack: Stack, smollm2_worker: None
) -> None:
    started, at_start, begin = started_now(), machine(), time.perf_counter()
    result = await measured(smollm2_engine, stack.base_url, SMOKE)
    write_part(result, tmp_path, SMOKE.name, started, time.perf_counter() - begin, at_start)
    write_report(tmp_path)
    document = json.loads((tmp_path / "C.json").read_text())
    check_common(document, "C", tmp_path)
    runs = document["data"]["runs"]
    assert {(r["system"], r["concurrency"]) for r in runs} == {
        (s, c) for s in (PIPELINE, ENGINE) for c in SMOKE.llm_streams
    }
    for run in runs:
        assert run["generations"] >= SMOKE.llm_requests and run["tokens"] > 0, run
        assert run["tokens_per_s"] > 0 and run["ttft_p50_ms"] > 0
