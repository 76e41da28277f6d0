"""The minilm example on PyTorch (`minilm:torch`): on the CPU it serves the same vectors as the
ONNX engine (its CUDA options ignored), bucket padding never changes a vector, output buffers are
reused, and the stage pipeline that overlaps host and device work keeps every result with its
job. The `gpu` tests check fp16, CUDA graphs and the served variant on a CUDA device."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import torch

from conveyor.stack import Stack
from shared.codec import RequestEntry, dumps, loads
from shared.job_store import JobStore, now_ms
from shared.keys import Keys
from shared.model_repository import CudaGraphBuckets, ModelConfigError, ModelRepository
from tests.conftest import REPO_ROOT
from tests.minilm_reference import (
    DIMENSION,
    MAX_SEQ_LENGTH,
    NO_TOKENS,
    SENTENCES,
    assert_base64_beside_numbers,
    assert_served_as_float32,
    assert_usage_counts_tokens,
    cosines,
    minilm_config,
    prepared_artifacts,
    reference_embeddings,
    vectors,
)
from tests.stage_overlap import trace_two_micro_batches
from workers.batching.micro_batch_executor import Outcome
from workers.batching.stage_pipeline import StagePipeline
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine
from workers.engines.registry import create_engine
from workers.engines.text_encoding import TextEncoder, flatten_texts
from workers.engines.torch_engine import (
    CallShapes,
    PreparedBatch,
    TorchEngine,
    compile_encoder,
    cuda_missing,
)
from workers.partition.stream_reader import StreamReader

CUDA_MISSING = cuda_missing()
needs_cuda = pytest.mark.skipif(CUDA_MISSING is not None, reason=CUDA_MISSING or "")


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return prepared_artifacts()


def torch_engine(
    artifacts: Path, parameters: dict[str, Any] | None = None, **torch_options: Any
) -> TorchEngine:
    """The `torch` variant of the repository's minilm, its torch options (and any other
    `parameters`) overridden."""
    config = minilm_config()
    variant = config.variants["torch"]
    options = {**variant.parameters["torch"], **torch_options}
    own = {**variant.parameters, **(parameters or {}), "torch": options}
    variant = variant.model_copy(update={"parameters": own})
    config = config.model_copy(update={"variants": {**config.variants, "torch": variant}})
    engine = create_engine(config, "torch", artifacts.parent)
    assert isinstance(engine, TorchEngine)
    engine.load()
    return engine


@pytest.fixture(scope="module")
def cpu_engine(artifacts: Path) -> TorchEngine:
    """The repository's variant on the CPU (its CUDA graph buckets and fp16 ignored there)."""
    engine = torch_engine(artifacts, device="cpu")
    engine.warmup()
    return engine


def bucketed(
    artifacts: Path, max_texts: int = 256, buckets: CudaGraphBuckets | None = None
) -> CallShapes:
    """Calls shaped as on CUDA, by `buckets` (else the repository variant's)."""
    chosen = buckets or minilm_config().torch_options("torch").cuda_graphs
    return CallShapes(TextEncoder.from_artifacts(artifacts, MAX_SEQ_LENGTH), max_texts, chosen)


# Calls of at most 4 texts, each padded to 1 or 4 rows of 256 tokens.
FOUR_ROWS = CudaGraphBuckets(batch_buckets=[1, 4], seq_buckets=[256])


def run_shaped(
    engine: TorchEngine, jobs: list[dict[str, Any]], shapes: CallShapes
) -> tuple[list[tuple[Any, int]], list[dict[str, Any]]]:
    """The jobs' calls shaped by `shapes` and their outputs, through the engine's device stage
    (on the CPU: CUDA's padded shapes, run eagerly)."""
    texts, split = flatten_texts(jobs)
    calls = shapes.calls(texts)
    return calls, engine.finish(engine.run(PreparedBatch(split.counted(calls), calls)))


def test_the_variant_is_the_same_model_on_the_torch_backend():
    config = minilm_config()
    assert config.backend_of("default") == "onnxruntime"
    assert config.backend_of("torch") == "torch"
    assert config.variants["torch"].weight == 0
    assert config.preferred_batch_sizes_of("torch") == [8, 32]
    assert config.preferred_batch_sizes_of("default") == []


def test_cpu_embeddings_equal_the_onnx_engine(cpu_engine, artifacts):
    onnx = OnnxRuntimeEngine(minilm_config(), "default", str(artifacts))
    onnx.load()
    expected = vectors(onnx.infer([{"texts": SENTENCES}]))
    outputs = cpu_engine.infer([{"texts": SENTENCES[:5]}, {"texts": SENTENCES[5:]}])
    got = vectors(outputs)
    assert got.shape == (len(SENTENCES), DIMENSION)
    assert_served_as_float32(outputs[0])
    assert cosines(got, expected).min() >= 0.999
    assert cosines(got, reference_embeddings(SENTENCES)).min() >= 0.999


def test_cuda_options_on_the_cpu_are_ignored_with_a_logged_reason(artifacts, caplog):
    """The repository's variant asks for CUDA graphs and fp16 (`device: auto`): on the CPU each
    call was padded up to its graph bucket all the same (4 texts ran as 8 rows of 32 tokens),
    work for nothing. Both are ignored there, each saying so."""
    with caplog.at_level(logging.WARNING, logger="workers.engines.torch_engine"):
        engine = torch_engine(artifacts, device="cpu")
    [(batch, rows)] = engine.prepare([{"texts": SENTENCES[:3]}, {"texts": ["short"]}]).calls
    assert batch.shape[0] == rows == 4
    assert batch.attention_mask[:, -1].any()  # as wide as its longest text, no wider
    assert engine.dtype == torch.float32
    said = [r.getMessage() for r in caplog.records]
    for option in ("cuda_graphs", "dtype fp16"):
        assert any(f"parameters.torch.{option} is for CUDA, ignored on the CPU" in m for m in said)


def test_calls_are_padded_up_to_their_bucket(artifacts):
    shapes = bucketed(artifacts)
    [(batch, rows)] = shapes.calls([*SENTENCES[:3], "short"])
    assert (batch.shape, rows) == ((8, 32), 4)
    assert not batch.attention_mask[rows:].any()
    [(long, _)] = shapes.calls(SENTENCES)
    assert long.shape == (32, 256)  # the 12th sentence is truncated to 256 tokens


def test_bucket_padding_never_changes_a_result(cpu_engine, artifacts):
    [(batch, _)] = cpu_engine.prepare([{"texts": SENTENCES[:11]}]).calls
    assert batch.shape[0] == 11 and batch.shape[1] < 64  # padded to its longest text only
    for texts in (SENTENCES[:11], SENTENCES[7:9], [SENTENCES[0]]):
        plain = vectors(cpu_engine.infer([{"texts": texts}]))
        calls, outputs = run_shaped(cpu_engine, [{"texts": texts}], bucketed(artifacts))
        assert calls[0][0].shape[0] in (1, 8, 32)
        assert cosines(plain, vectors(outputs)).min() >= 0.9999


def test_a_micro_batch_beyond_the_largest_bucket_is_split_into_calls(cpu_engine, artifacts):
    shapes = bucketed(artifacts, 4, FOUR_ROWS)
    jobs = [{"texts": SENTENCES[:6]}, {"texts": SENTENCES[6:9]}]
    calls, outputs = run_shaped(cpu_engine, jobs, shapes)
    assert [(b.shape, rows) for b, rows in calls] == [((4, 256), 4), ((4, 256), 4), ((1, 256), 1)]
    assert [len(o["embeddings"]) for o in outputs] == [6, 3]
    assert cosines(vectors(outputs), reference_embeddings(SENTENCES[:9])).min() >= 0.999


def test_max_texts_per_call_cuts_calls(artifacts):
    """The torch engine ignored it (calls were cut at the largest bucket only), though the
    model repository's `parameters` say every encoder engine reads it."""
    engine = torch_engine(artifacts, {"max_texts_per_call": 3}, device="cpu")
    prepared = engine.prepare([{"texts": SENTENCES[:5]}, {"texts": SENTENCES[5:8]}])
    assert [(b.shape[0], rows) for b, rows in prepared.calls] == [(3, 3), (3, 3), (2, 2)]
    outputs = engine.finish(engine.run(prepared))
    assert cosines(vectors(outputs), reference_embeddings(SENTENCES[:8])).min() >= 0.999


def test_usage_counts_each_jobs_tokens_across_calls_padded_to_buckets(cpu_engine, artifacts):
    shapes = bucketed(artifacts, 4, FOUR_ROWS)
    jobs = [{"texts": SENTENCES[9:12]}, {"texts": SENTENCES[:4]}]
    calls, outputs = run_shaped(cpu_engine, jobs, shapes)
    assert [(b.shape, rows) for b, rows in calls] == [((4, 256), 4), ((4, 256), 3)]
    assert_usage_counts_tokens(jobs, outputs)


def test_output_buffers_are_leased_and_reused(cpu_engine):
    first = cpu_engine.run(cpu_engine.prepare([{"texts": ["one", "two"]}]))
    overlapped = cpu_engine.run(cpu_engine.prepare([{"texts": ["three"] * 5}]))
    # Two micro-batches in flight in the same bucket never share a buffer...
    assert first.calls[0].buffer is not overlapped.calls[0].buffer
    buffers = {id(first.calls[0].buffer), id(overlapped.calls[0].buffer)}
    cpu_engine.finish(first)
    cpu_engine.finish(overlapped)
    allocated = cpu_engine.buffers.allocated
    # ...and once finished, later micro-batches of that bucket reuse them: no new allocation.
    for texts in (["again"] * 3, ["and", "again"]):
        running = cpu_engine.run(cpu_engine.prepare([{"texts": texts}]))
        assert id(running.calls[0].buffer) in buffers
        cpu_engine.finish(running)
    assert cpu_engine.buffers.allocated == allocated


def test_a_call_that_fails_gives_its_micro_batchs_buffers_back(artifacts):
    """A failing call (CUDA out of memory on a large eager batch) kept the buffers of its
    micro-batch's calls, and every bisection's retry leased more."""
    engine = torch_engine(artifacts, {"max_texts_per_call": 1}, device="cpu")
    model = engine.model
    calls = 0

    def every_second_call_fails(**feeds: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            raise RuntimeError("CUDA out of memory (as if)")
        return model(**feeds)

    engine.model = every_second_call_fails
    for _ in range(10):
        with pytest.raises(RuntimeError, match="out of memory"):
            engine.run(engine.prepare([{"texts": ["one", "two"]}]))
    assert engine.buffers.allocated <= 2, engine.buffers.allocated


def test_a_job_may_take_its_vectors_as_base64_beside_one_that_takes_numbers(cpu_engine):
    assert_base64_beside_numbers(cpu_engine)


def test_a_job_without_texts_gets_no_vectors(cpu_engine):
    outputs = cpu_engine.infer([{"texts": []}, {"texts": ["only me"]}])
    assert loads(dumps(outputs[0])) == {"embeddings": [], "usage": NO_TOKENS}
    assert len(outputs[1]["embeddings"]) == 1


async def test_the_stage_pipeline_keeps_results_with_their_jobs(cpu_engine):
    """Many micro-batches submitted back to back overlap their stages; every job still gets
    its own texts' vectors, and the one bad input in a micro-batch fails alone."""
    pipeline = StagePipeline(cpu_engine)
    expected = {s: v for s, v in zip(SENTENCES, reference_embeddings(SENTENCES), strict=True)}
    results: dict[int, list[Outcome]] = {}
    batches: dict[int, list[dict[str, Any]]] = {}
    rng = np.random.default_rng(7)
    for n in range(10):
        jobs = [{"texts": list(rng.choice(SENTENCES, rng.integers(1, 4)))} for _ in range(3)]
        if n == 4:
            jobs.insert(1, {"texts": ["fine", 3]})
        batches[n] = jobs

    async def collect(n: int, outcomes: list[Outcome]) -> None:
        await asyncio.sleep(0.01 * (n % 3))  # write-backs end out of order
        results[n] = outcomes

    try:
        for n, jobs in batches.items():
            await pipeline.submit(jobs, partial(collect, n))
        await pipeline.drain()
    finally:
        pipeline.close()
    assert sorted(results) == list(batches)
    for n, jobs in batches.items():
        assert len(results[n]) == len(jobs)
        for job, outcome in zip(jobs, results[n], strict=True):
            if job["texts"] == ["fine", 3]:
                assert outcome.error is not None and "list of strings" in outcome.error["message"]
                continue
            assert outcome.error is None and outcome.output is not None
            got = np.array(outcome.output["embeddings"])
            want = np.array([expected[t] for t in job["texts"]])
            assert cosines(got, want).min() >= 0.999
        if n != 4:  # one engine call per micro-batch: one batch id and size for all its jobs
            assert {(o.batch_id, o.batch_size) for o in results[n]} == {
                (results[n][0].batch_id, len(jobs))
            }


async def test_a_failed_micro_batchs_rerun_never_runs_beside_the_next_one(cpu_engine, monkeypatch):
    """A micro-batch that failed `prepare` was rerun (bisected) through `infer` on another
    thread, its `run` calls at once with the next micro-batch's on the device thread: a staged
    engine is promised one `run` at a time, and one with static buffers would mix them."""
    run, active, most = cpu_engine.run, [0], [0]
    lock = threading.Lock()

    def one_at_a_time(prepared: Any) -> Any:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)  # a device run long enough to meet the other's
        try:
            return run(prepared)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(cpu_engine, "run", one_at_a_time)
    results: dict[int, list[Outcome]] = {}

    async def keep(n: int, outcomes: list[Outcome]) -> None:
        results[n] = outcomes

    pipeline = StagePipeline(cpu_engine)
    try:
        await pipeline.submit([{"texts": ["fine", 3]}, {"texts": ["good"]}], partial(keep, 0))
        await pipeline.submit([{"texts": ["next"]}], partial(keep, 1))
        await pipeline.drain()
    finally:
        pipeline.close()
    assert [o.error is None for o in results[0]] == [False, True]
    assert [o.error is None for o in results[1]] == [True]
    assert most[0] == 1


async def test_a_bisected_micro_batch_counts_every_call_on_the_device(cpu_engine):
    """The just-in-time read learns how long the device is busy with a micro-batch: after a bad
    input made it rerun in parts, that is all the parts' calls, not the longest."""
    pipeline = StagePipeline(cpu_engine)
    results: list[Outcome] = []

    async def collect(outcomes: list[Outcome]) -> None:
        results.extend(outcomes)

    jobs = [{"texts": [s]} for s in SENTENCES[:3]] + [{"texts": ["fine", 3]}]
    try:
        await pipeline.submit(jobs, collect)
        await pipeline.drain()
    finally:
        pipeline.close()
    calls = {o.batch_id: o.engine_ms for o in results}
    assert len(calls) > 1 and results[-1].error is not None
    assert pipeline.schedule.run_s == pytest.approx(sum(calls.values()) / 1000)


async def test_the_next_micro_batch_is_tokenised_while_the_device_runs(cpu_engine, monkeypatch):
    """Host stages run on the tokenizer pool the config sizes, the device stage on one thread of
    its own, and the next micro-batch is tokenised while the device runs this one."""
    trace = await trace_two_micro_batches(cpu_engine, monkeypatch)
    assert trace.overlapped == [True, True]
    assert trace.errors() == [[None], [None]]
    configured = minilm_config().torch_options("torch").tokenizer_threads
    assert cpu_engine.host_threads == configured
    host_pool = {f"engine-host_{i}" for i in range(configured)}
    assert trace.threads["prepare"] | trace.threads["finish"] <= host_pool
    assert trace.threads["run"] == {"engine-device_0"}


def test_the_encoder_traces_whole_with_no_host_sync(cpu_engine):
    """What a CUDA graph capture needs, checked on the CPU: the pooled encoder compiles as one
    graph (dynamo's fullgraph: no graph break, so no data-dependent branch and no host read
    such as `.item()` inside it), and that graph computes what eager does."""
    [(batch, _)] = cpu_engine.prepare([{"texts": SENTENCES[:3]}]).calls
    feeds = {name: torch.from_numpy(array) for name, array in batch.feeds().items()}
    whole = torch.compile(cpu_engine.model, fullgraph=True, backend="eager", dynamic=False)
    try:
        with torch.no_grad():
            traced, eager = whole(**feeds), cpu_engine.model(**feeds)
    finally:
        torch._dynamo.reset()
    assert traced.shape == (3, DIMENSION)
    assert torch.allclose(traced, eager, atol=1e-6)


async def test_gathering_stops_at_a_preferred_size_when_the_queue_runs_dry(aredis):
    """3 jobs in hand, preferred size 4: the gather waits for one more job, then returns at 4
    rather than waiting out its 60 s delay for a full batch of 32."""
    keys = Keys()
    stream = keys.queue("minilm", "torch")
    store = JobStore(aredis, keys, ttl_s=60)
    reader = StreamReader(aredis, keys, [stream], "gatherer")
    await reader.ensure_groups()

    async def enqueue(n: int) -> None:
        for _ in range(n):
            entry = RequestEntry(uuid.uuid4().hex, {"inputs": {"texts": ["x"]}}, now_ms())
            await store.create(entry, stream, {"model": "minilm", "variant": "torch"})

    await enqueue(3)
    batch = await reader.take([stream], 32)
    assert batch is not None and len(batch[1]) == 3
    gathering = asyncio.create_task(reader.gather(batch, 32, 60_000, preferred=[4, 16]))
    await asyncio.sleep(0.2)
    assert not gathering.done()  # 3 is not a preferred size: it keeps gathering
    await enqueue(1)
    _, deliveries = await asyncio.wait_for(gathering, 30)
    assert len(deliveries) == 4
    await enqueue(1)
    assert await aredis.xlen(stream) == 5  # the later job stays queued for the next batch
    assert len((await reader.take([stream], 32) or ("", []))[1]) == 1


def test_invalid_torch_options_fail_with_a_clear_error(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    text = (REPO_ROOT / "model_repository" / "minilm" / "config.yaml").read_text()
    (folder / "config.yaml").write_text(text.replace("dtype: fp16", "dtype: fp8"))
    with pytest.raises(ModelConfigError, match=r"variant torch: parameters.torch: .*dtype"):
        ModelRepository.load(tmp_path)
    (folder / "config.yaml").write_text(text.replace("[8, 32]", "[8, 64]"))
    with pytest.raises(ModelConfigError, match="preferred_batch_sizes"):
        ModelRepository.load(tmp_path)
    (folder / "config.yaml").write_text(text.replace("[32, 64, 128, 256]", "[64, 32]"))
    with pytest.raises(ModelConfigError, match="seq_buckets must be positive, ascending"):
        ModelRepository.load(tmp_path)


def test_seq_buckets_past_the_models_positions_are_refused_at_load(artifacts: Path) -> None:
    """A seq bucket wider than the model's position embeddings failed CUDA graph capture at
    warm-up, and the worker restarted into the same failure; the repository only knows the
    positions of `prepare: minilm`. The engine reads them from config.json and refuses the
    bucket when it loads, on the CPU as well, which ignores the buckets (the helper skips the
    repository's check)."""
    buckets = {"batch_buckets": [1, 8], "seq_buckets": [256, 1024]}
    with pytest.raises(ValueError, match=r"seq_buckets .*1024 exceeds the model's 512 positions"):
        torch_engine(artifacts, device="cpu", cuda_graphs=buckets)
    fits = {"batch_buckets": [1, 8], "seq_buckets": [256, 512]}
    torch_engine(artifacts, device="cpu", cuda_graphs=fits)  # loads


def test_compile_with_buckets_keeps_one_graph_per_bucket_pair(cpu_engine) -> None:
    """Static shapes compile once per (batch, seq) bucket pair, and dynamo ran every pair past
    its default recompile_limit (8) eagerly, silently. 3 x 3 pairs here, each traced by dynamo
    for real, on the CPU engine's encoder as on CUDA's; dynamo's `eager` backend (its debug
    override, on this thread only) stands in for inductor's minutes of code generation."""
    buckets = CudaGraphBuckets(batch_buckets=[1, 2, 4], seq_buckets=[8, 16, 32])
    model = compile_encoder(cpu_engine.model, buckets)
    frames = torch._dynamo.utils.counters["frames"]
    compiled = frames["ok"]
    try:
        with torch._dynamo.config.patch(debug_backend_override=">=0:eager"), torch.no_grad():
            for rows in buckets.batch_buckets:
                for width in buckets.seq_buckets:
                    feeds = {
                        name: torch.ones((rows, width), dtype=torch.int64)
                        for name in ("input_ids", "attention_mask", "token_type_ids")
                    }
                    assert model(**feeds).shape == (rows, DIMENSION)
    finally:
        torch._dynamo.reset()
    assert frames["ok"] - compiled == 9


def test_cuda_without_a_device_fails_loudly(artifacts: Path) -> None:
    """`device: cuda` where torch sees no device fails, naming why, rather than serving from
    the CPU; run with no device visible (CUDA_VISIBLE_DEVICES empty), so a GPU machine checks
    it too."""
    code = (
        "from tests.test_torch_engine import torch_engine; from pathlib import Path; "
        f"torch_engine(Path({str(artifacts)!r}), device='cuda')"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert re.search(r"RuntimeError: .*(no CUDA device|torch built without CUDA)", done.stderr), (
        done.stderr[-2000:]
    )


def test_the_pipeline_serves_minilm_torch(stack: Stack, base_url: str, minilm_worker: int) -> None:
    device = "cpu" if CUDA_MISSING else "cuda"  # `device: auto`
    assert f"on {device} in" in (stack.log_dir / "minilm.log").read_text()
    response = httpx.post(
        f"{base_url}/v1/models/minilm/predict",
        json={"inputs": {"texts": SENTENCES}, "variant": "torch"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["variant"] == "torch"
    got = np.array(body["outputs"]["embeddings"])
    assert cosines(got, reference_embeddings(SENTENCES)).min() >= 0.999


async def test_concurrent_jobs_on_minilm_torch_each_get_their_own_vectors(
    base_url: str, minilm_worker: int, stack_redis: redis.Redis
) -> None:
    """Through the worker's stage pipeline: concurrent jobs share micro-batches, each gets its
    own texts' vectors, and every job of one engine call records that call's size."""
    rng = np.random.default_rng(11)
    picks = [list(rng.choice(len(SENTENCES), rng.integers(1, 4))) for _ in range(24)]
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/models/minilm/predict",
                    json={"inputs": {"texts": [SENTENCES[i] for i in pick]}, "variant": "torch"},
                )
                for pick in picks
            )
        )
    reference = reference_embeddings(SENTENCES)
    calls: dict[str, list[int]] = {}
    for pick, response in zip(picks, responses, strict=True):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["variant"] == "torch"
        got = np.array(body["outputs"]["embeddings"])
        assert got.shape == (len(pick), DIMENSION)
        assert cosines(got, reference[pick]).min() >= 0.999
        job: dict[str, str] = stack_redis.hgetall(Keys().job(body["id"]))  # type: ignore[assignment]
        calls.setdefault(job["batch_id"], []).append(int(job["batch_size"]))
    assert max(len(sizes) for sizes in calls.values()) > 1, calls  # jobs did share calls
    assert all(sizes == [len(sizes)] * len(sizes) for sizes in calls.values()), calls


@pytest.mark.gpu
@needs_cuda
def test_fp16_on_cuda_equals_fp32_on_the_cpu(artifacts):
    cpu = torch_engine(artifacts, device="cpu", dtype="fp32", cuda_graphs=None)
    gpu = torch_engine(artifacts, device="cuda", dtype="fp16")
    gpu.warmup()
    expected = vectors(cpu.infer([{"texts": SENTENCES}]))
    assert cosines(vectors(gpu.infer([{"texts": SENTENCES}])), expected).min() >= 0.999


@pytest.mark.gpu
@needs_cuda
def test_graph_replay_equals_eager_and_nothing_is_captured_after_warmup(artifacts):
    graphs = torch_engine(artifacts, device="cuda", dtype="fp16")
    graphs.warmup()
    buckets = minilm_config().torch_options("torch").cuda_graphs
    assert buckets is not None
    assert graphs.captures == len(buckets.batch_buckets) * len(buckets.seq_buckets)
    captured, replayed = graphs.captures, graphs.replays
    eager = torch_engine(artifacts, device="cuda", dtype="fp16")  # not warmed: no graphs
    calls = 0
    for size in (1, 3, 9, 33, 200, 300):  # 300 texts: two calls (256 + 44)
        jobs = [{"texts": [SENTENCES[i % len(SENTENCES)] for i in range(size)]}]
        assert cosines(vectors(graphs.infer(jobs)), vectors(eager.infer(jobs))).min() >= 0.9999
        calls += -(-size // buckets.batch_buckets[-1])
    assert (eager.captures, eager.replays) == (0, 0)
    assert graphs.captures == captured  # nothing captured under load...
    assert graphs.replays - replayed == calls  # ...and every call a replay, none eager


@pytest.mark.gpu
@needs_cuda
def test_outputs_come_back_through_reused_pinned_buffers_on_cuda(artifacts):
    """Each call copies its vectors asynchronously into a page-locked buffer; after warm-up,
    micro-batches of one bucket reuse its buffer instead of allocating."""
    engine = torch_engine(artifacts, device="cuda", dtype="fp16")
    engine.warmup()  # its call leased and gave back the 8-row bucket's buffer
    allocated = engine.buffers.allocated
    buffers = set()
    # 2, 5 and 8 texts all fit the 8-row bucket (1 text alone would take the 1-row one).
    for texts in (["one", "two"], ["three"] * 5, ["four"] * 8):
        running = engine.run(engine.prepare([{"texts": texts}]))
        [call] = running.calls
        assert call.buffer.is_pinned() and call.done is not None
        buffers.add(id(call.buffer))
        engine.finish(running)
    assert len(buffers) == 1
    assert engine.buffers.allocated == allocated


@pytest.mark.gpu
@needs_cuda
def test_waiting_for_the_device_sleeps_instead_of_spinning_a_core(artifacts):
    """`finish` waits on the micro-batch's event while the device is busy (here, ~tens of ms of
    matrix products queued ahead of it on the engine's stream): a blocking event sleeps through
    the wait, a default one busy-waits and burns the waiting thread's core the whole time."""
    engine = torch_engine(artifacts, device="cuda", dtype="fp16")
    engine.warmup()
    assert engine.stream is not None
    with torch.cuda.stream(engine.stream):  # made and used on the engine's stream alone
        square = torch.randn((8192, 8192), device="cuda", dtype=torch.float16)
        for _ in range(30):
            square = (square @ square).clamp_(-1, 1)
    running = engine.run(engine.prepare([{"texts": SENTENCES}]))
    [call] = running.calls
    assert call.done is not None and not call.done.query(), "the device is idle: no wait"
    cpu, wall = time.thread_time(), time.perf_counter()
    engine.finish(running)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert cpu < wall / 2, f"the wait used {cpu * 1000:.1f} ms of CPU in {wall * 1000:.1f} ms"


@pytest.mark.gpu
@needs_cuda
def test_the_worker_serves_minilm_torch_on_cuda(
    stack: Stack, base_url: str, minilm_worker: int
) -> None:
    """The session's minilm worker loads `device: auto`, so with a CUDA device it is on CUDA."""
    assert "on cuda in" in (stack.log_dir / "minilm.log").read_text()
    test_the_pipeline_serves_minilm_torch(stack, base_url, minilm_worker)
