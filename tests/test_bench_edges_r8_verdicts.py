"""Benchmark verdicts on small given figures (no benchmark part runs): a target compared over
runs with failed requests gives no verdict, and parts B's and C's targets are judged on
unrounded rates and latencies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import scaling
from benchmarks.batching_efficiency import NO_BATCHING, _engine_rate, open_loop_point
from benchmarks.batching_efficiency import targets as part_b_targets
from benchmarks.llm_streaming import ENGINE, PIPELINE, Stream, _summary
from benchmarks.llm_streaming import targets as part_c_targets
from benchmarks.load import LoadResult
from benchmarks.pipeline_overhead import CELERY, CONVEYOR, IN_PROCESS, MINIMAL_HOP
from benchmarks.pipeline_overhead import targets as part_a_targets
from benchmarks.process_cpu import LOAD_GENERATOR
from benchmarks.report import PartResult, Target, machine, write_part, write_report
from shared.model_repository import ModelConfig
from workers.engines.identity_engine import IdentityEngine

CPU_MS = {"producer": 0.3, "worker": 0.1, "valkey": 0.05, LOAD_GENERATOR: 0.1}


def _run(
    system: str, concurrency: int, rps: float, p50_ms: float, errors: int = 0
) -> dict[str, Any]:
    return {
        "system": system,
        "concurrency": concurrency,
        "rps": rps,
        "p50_ms": p50_ms,
        "errors": errors,
        "cpu_ms": CPU_MS,
    }


def test_part_a_throughput_against_a_failing_baseline_is_no_verdict() -> None:
    """Failed requests count in no system's requests/s: Celery's timeouts lowered its rate,
    and the Conveyor ÷ Celery ratio read met (4.0) over a baseline with 400 failed requests."""
    runs = [
        _run(CONVEYOR, 1, 900.0, 1.0),
        _run(CELERY, 1, 300.0, 4.0),
        _run(MINIMAL_HOP, 1, 1000.0, 0.8),
        _run(IN_PROCESS, 1, 1500.0, 0.5),
        _run(CONVEYOR, 32, 2000.0, 15.0),
        _run(CELERY, 32, 500.0, 60.0, errors=400),
        _run(MINIMAL_HOP, 32, 3000.0, 10.0),
        _run(IN_PROCESS, 32, 3500.0, 9.0),
    ]
    by_name = {t.name: t for t in part_a_targets(runs)}
    throughput = by_name["Conveyor ÷ Celery throughput at concurrency 32"]
    assert throughput.measured == 4.0
    assert not throughput.met
    assert throughput.verdict().startswith("no verdict (400 failed requests)")
    # at concurrency 1 nothing failed: that verdict stands
    assert by_name["Conveyor ÷ Celery p50 latency at concurrency 1"].met


def test_part_e_scaling_with_failed_requests_is_no_verdict() -> None:
    """Part E's ratio of jobs/s counts completed jobs only; failures at 1 pair lowered the
    base and read met."""
    steps = [
        {"pairs": 1, "jobs_per_s": 500.0, "errors": 120},
        {"pairs": 2, "jobs_per_s": 900.0, "errors": 0},
    ]
    [target] = scaling.targets(steps)
    assert target.measured == 0.9
    assert not target.met and not target.judged


def test_the_report_prints_failed_requests_as_no_verdict(tmp_path: Path) -> None:
    """A target met on paper over failed requests reads no verdict in REPORT.md, not met."""
    failed = Target("throughput ratio", 4.0, 3.0, higher_is_better=True, errors=7)
    result = PartResult(part="A", title="Pipeline overhead", targets=[failed])
    write_part(result, tmp_path, "full", "2026-12-01 00:00:00 UTC", 1.0, machine())
    lines = [
        line for line in write_report(tmp_path).read_text().splitlines() if failed.name in line
    ]
    assert len(lines) == 2  # the headline's row and the part's own line
    assert all("no verdict (7 failed requests)" in line for line in lines), lines
    assert not any("| met |" in line or ": met," in line for line in lines), lines


def _open_loop(completed: int, span_s: float) -> LoadResult:
    """An open loop whose answers came `span_s` apart, first to last."""
    load = LoadResult(offered=completed, sending_s=span_s, first_done=10.0)
    load.last_done = 10.0 + span_s
    load.latencies_s = [0.01] * completed
    return load


def test_part_b_saturation_is_judged_unrounded() -> None:
    """The pipeline's capacity was rounded to 0.1 sentences/s before the target read it:
    849.96 read 850.0, met against ≥ 0.85 of the engine's 1,000."""
    batching = open_loop_point("max_queue_delay_ms 2", 900.0, _open_loop(851, 850 / 849.96))
    unbatched = open_loop_point(NO_BATCHING, 400.0, _open_loop(401, 1.0))
    saturation = {p["config"]: p["achieved_per_s"] for p in (batching, unbatched)}
    engine = [{"sentences_per_s": 250.0}, {"sentences_per_s": 1000.0}]
    [share, _] = part_b_targets(engine, saturation, {})
    assert abs(share.measured - 0.84996) < 1e-9
    assert not share.met


def test_part_b_engine_rate_is_kept_unrounded() -> None:
    """The engine's sentences/s, the saturation target's other side, was rounded to 0.1 too."""
    config = ModelConfig(name="m", kind="batch", backend="identity")
    row = _engine_rate(IdentityEngine(config, "default", ""), ["a", "b", "c"], 2, 0.02)
    # done ÷ elapsed from the clock is never a multiple of 0.1 unless rounded
    assert row["sentences_per_s"] != round(row["sentences_per_s"], 1)


def test_part_c_targets_are_judged_unrounded() -> None:
    """TTFT p50s and tokens/s were rounded to 0.01 before the targets divided them: a 50.004 ms
    p50 read 50.0, met against the engine's 35 ms + 15, and 79.996 tokens/s read 80.0, met
    against ≥ 0.8 of 100."""
    runs = [
        _summary(PIPELINE, 1, [Stream(0.050004, 1.0, 10)], 1.0),
        _summary(ENGINE, 1, [Stream(0.035, 1.0, 10)], 1.0),
        _summary(PIPELINE, 16, [Stream(0.1, 1.0, 100)], 100 / 79.996),
        _summary(ENGINE, 16, [Stream(0.1, 1.0, 100)], 1.0),
    ]
    ttft, tokens = part_c_targets(runs)
    assert ttft.measured > 1.0 and not ttft.met
    assert tokens.measured < 0.8 and not tokens.met
