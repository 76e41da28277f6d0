"""How big a benchmark run is: `full` is `make bench` (under 15 minutes on 2 cores), `quick` is a
look in about a minute per part, `smoke` only proves the code still runs (the test suite)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Scale:
    name: str
    # Measured seconds per configuration, and unmeasured warm-up before each.
    seconds: float
    warmup_s: float
    # Upper bound on requests per configuration, whatever the time.
    max_requests: int
    # Part A: closed-loop concurrencies.
    concurrencies: tuple[int, ...]
    # Rounds over A's configurations and B's engine batch sizes, interleaved; the best round of
    # each counts (neighbours on a shared machine only ever slow a round down).
    rounds: int
    # Part B: engine batch sizes in-process; offered rates as fractions of the engine's best
    # throughput; max_queue_delay_ms settings of the pipeline.
    engine_batch_sizes: tuple[int, ...]
    rate_fractions: tuple[float, ...]
    queue_delays_ms: tuple[float, ...]
    # Part D: jobs per phase.
    redis_jobs: int
    # Seconds py-spy samples the pipeline's processes for the "where the time goes" section.
    profile_s: float
    # Part C: concurrent streams; generations per concurrency (at least `llm_rounds` per
    # client); max_tokens of each greedy generation.
    llm_streams: tuple[int, ...]
    llm_requests: int
    llm_rounds: int
    llm_max_tokens: int
    # Part E: producer+worker pairs up to this many (0: the machine's cores); closed-loop
    # clients per load-generator process (one process per producer).
    scale_max_pairs: int
    scale_concurrency: int
    # Part E: Valkey's I/O threads (0: as many as the machine's cores spare, scaling.io_threads).
    scale_io_threads: int = 0
    # Part F: the flooding tenant's jobs, the quiet tenant's spaced ones beside it, and alone
    # (the unloaded p99 the target divides by: of 50 jobs it was their slowest, 3 to 8 ms from
    # run to run, which moved the ratio 3x with no change in code).
    # B sends at least `fair_quiet` beside the flood, and goes on until it drained; the target
    # needs `fair_met` of B's jobs that met the flood (of 50, its p99 was one job's wait).
    fair_flood: int = 2_000
    fair_quiet: int = 50
    fair_unloaded: int = 400
    fair_met: int = 100


FULL = Scale(
    name="full",
    seconds=4.0,
    warmup_s=0.5,
    max_requests=50_000,
    concurrencies=(1, 8, 32, 128),
    rounds=2,
    engine_batch_sizes=(1, 2, 4, 8, 16, 32, 64),
    rate_fractions=(0.25, 0.5, 0.7, 0.85, 1.0, 1.2),
    queue_delays_ms=(0.0, 2.0, 5.0, 10.0),
    redis_jobs=2_000,
    profile_s=5.0,
    llm_streams=(1, 4, 16),
    llm_requests=24,  # the target is a p50 at 1 stream: of 8, it moved with one slow sample
    llm_rounds=2,
    llm_max_tokens=48,
    scale_max_pairs=0,
    scale_concurrency=32,
)

QUICK = Scale(
    name="quick",
    seconds=2.0,
    warmup_s=0.5,
    max_requests=20_000,
    concurrencies=(1, 8, 32, 128),
    rounds=1,
    engine_batch_sizes=(1, 4, 16, 64),
    rate_fractions=(0.5, 0.85, 1.2),
    queue_delays_ms=(0.0, 2.0, 5.0, 10.0),
    redis_jobs=500,
    profile_s=2.0,
    llm_streams=(1, 4, 16),
    llm_requests=4,
    llm_rounds=1,
    llm_max_tokens=32,
    scale_max_pairs=0,
    scale_concurrency=32,
)

SMOKE = Scale(
    name="smoke",
    seconds=0.5,
    warmup_s=0.05,  # unmeasured, and nothing here asserts on what it warms
    max_requests=500,
    concurrencies=(1, 8),
    rounds=1,
    engine_batch_sizes=(1, 4),
    rate_fractions=(0.3, 1.2),
    queue_delays_ms=(2.0,),
    redis_jobs=100,  # the backlog still more than one of identity's micro-batches (64)
    profile_s=1.0,
    # C still starts vLLM twice (side by side, ~55 s for both here), whatever its scale.
    llm_streams=(1, 2),
    llm_requests=1,
    llm_rounds=1,
    llm_max_tokens=4,
    scale_max_pairs=2,
    scale_concurrency=8,
    scale_io_threads=2,  # on any machine: the smoke test sees the server run with them
    fair_flood=200,  # a quiet CPU drains 100 in about 0.2 s: room for B to meet it
    fair_quiet=8,
    fair_unloaded=8,
    fair_met=1,
)

SCALES = {scale.name: scale for scale in (FULL, QUICK, SMOKE)}
