"""Scaling on seconds of backlog (shared/backlog.py): real workers measure what their jobs cost,
the producer exports `conveyor_backlog_seconds` and its JSON route, and the local autoscaler
reads the same formula, so two pools with equal entry counts but tenfold job costs get replica
counts in proportion to their seconds of work, where stream length would give them the same."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from autoscaling.local_autoscaler import PoolScaler
from autoscaling.scaling_math import BacklogTrigger, StreamTrigger, read_metric
from conveyor.stack import Stack
from shared.backlog import ServiceCost, queue_cost_write, read_backlogs
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository
from tests.conftest import REPO_ROOT, running_stack, until

KEYS = Keys("cv:")
JOB_MS = {"cheap": 20, "dear": 200}  # engine time of one job: tenfold apart
TARGET_S = 0.25  # seconds of backlog per replica: more than a job of either pool costs
QUEUED = 120  # entries per pool when the autoscaler looks: the cheap pool's ~11 replicas
STEP_MS, MAX_TOKENS = 10, 20  # the generate pool: one token every STEP_MS


def batch_model(name: str, **autoscaling: Any) -> dict[str, Any]:
    """One job per micro-batch, so a job's engine time is its cost."""
    return {
        "name": name,
        "kind": "batch",
        "backend": "tests.fault_engine:FaultEngine",
        "max_batch_size": 1,
        "max_queue_delay_ms": 0,
        "autoscaling": {
            "metric": "backlog_seconds",
            "backlog": {"target_s": TARGET_S, "cost_estimate_s": 0.05},
            "max_replicas": 200,
            **autoscaling,
        },
    }


def generate_model(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "generate",
        "backend": "tests.paced_engine:PacedEngine",
        "parameters": {"step_ms": STEP_MS, "default_max_tokens": 64},
        "max_num_seqs": 1,
        "autoscaling": {
            "metric": "backlog_seconds",
            "backlog": {"target_s": 5, "cost_estimate_s": 0.03},
        },
    }


def write_repository(root: Path, *models: dict[str, Any]) -> Path:
    for model in models:
        folder = root / model["name"]
        folder.mkdir(parents=True)
        body = {k: v for k, v in model.items() if k != "name"}
        (folder / "config.yaml").write_text(yaml.safe_dump(body))
    return root


def enqueue(client: redis.Redis, stream: str, count: int) -> None:
    pipe = client.pipeline()
    for i in range(count):
        pipe.xadd(stream, {"job": f"j{i}"})
    pipe.execute()


def backlog_reading(client: redis.Redis, config: ModelConfig) -> float:
    trigger = BacklogTrigger(config, "default", KEYS, target=TARGET_S, activation=0)
    return trigger.read(client).value


# ---------------------------------------------------------------- the formula on a real Redis


def test_unmeasured_pools_use_the_configured_estimate_then_the_measurement(redis_client):
    cheap = ModelConfig.model_validate(batch_model("cheap"))
    chat = ModelConfig.model_validate(generate_model("chat"))
    assert backlog_reading(redis_client, cheap) == 0  # no stream yet: no work
    for config in (cheap, chat):
        enqueue(redis_client, KEYS.queue(config.name, "default"), 5)
        enqueue(redis_client, KEYS.bulk_queue(config.name, "default"), 3)  # both lanes count
    assert backlog_reading(redis_client, cheap) == pytest.approx(8 * 0.05)
    # a generate pool's work is tokens: entries x default_max_tokens x seconds per token
    assert backlog_reading(redis_client, chat) == pytest.approx(8 * 64 * 0.03)

    pipe = redis_client.pipeline()
    queue_cost_write(pipe, KEYS, "chat", "default", ServiceCost(0.002, units_per_job=100))
    pipe.execute()
    assert backlog_reading(redis_client, chat) == pytest.approx(8 * 100 * 0.002)
    assert 0 < redis_client.ttl(KEYS.service_cost("chat", "default")) <= 7 * 86_400


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"metric": "queue_seconds"}, "'stream_length' or 'backlog_seconds'"),
        ({"metric": "backlog_seconds", "backlog": {"target_s": 0}}, "greater than 0"),
        ({"backlog": {"target_s": -5}}, "greater than 0"),
        ({"backlog": {"cost_estimate_s": 0}}, "greater than 0"),
        ({"backlog": {"scaler": "cpu"}}, "'metrics-api' or 'prometheus'"),
        ({"backlog": {"target": 3}}, "Extra inputs are not permitted"),
    ],
)
def test_bad_backlog_settings_are_refused_by_name(tmp_path, autoscaling, message):
    model = {"name": "m", "kind": "batch", "backend": "identity", "autoscaling": autoscaling}
    root = write_repository(tmp_path, model)
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(root)
    text = str(refused.value)
    assert str(root / "m" / "config.yaml") in text and "autoscaling" in text
    assert message in text


# ---------------------------------------------------------------- real workers, real engines


@pytest.fixture
def costly_stack(tmp_path: Path) -> Iterator[Stack]:
    root = write_repository(
        tmp_path / "models", batch_model("cheap"), batch_model("dear"), generate_model("paced")
    )
    with running_stack(
        tmp_path / "stack",
        CONVEYOR_MODEL_REPOSITORY=str(root),
        PYTHONPATH=str(REPO_ROOT),
        CONVEYOR_AUTH="disabled",
    ) as stack:
        yield stack


async def submit(base_url: str, bodies: list[dict[str, Any]]) -> list[str]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/v1/jobs", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [202] * len(bodies), responses[0].text
    return [r.json()["id"] for r in responses]


def batch_jobs(model: str, count: int) -> list[dict[str, Any]]:
    return [{"model": model, "inputs": {"sleep_ms": JOB_MS[model]}} for _ in range(count)]


def gauge(text: str, model: str) -> float:
    found = re.search(
        rf'^conveyor_backlog_seconds{{model="{model}",variant="default"}} (\S+)$', text, re.M
    )
    assert found, f"no conveyor_backlog_seconds for {model}"
    return float(found.group(1))


def test_equal_entries_tenfold_costs_scale_in_proportion(costly_stack: Stack) -> None:
    stack, client = costly_stack, redis.Redis.from_url(costly_stack.redis_url)
    http = httpx.Client(base_url=stack.base_url, timeout=30)
    repository = ModelRepository.load(Path(stack.env["CONVEYOR_MODEL_REPOSITORY"]))
    before = http.get("/metrics/backlog/dear/default").json()
    assert (before["measured"], before["seconds_per_unit"], before["unit"]) == (False, 0.05, "job")
    assert http.get("/metrics/backlog/nope/default").status_code == 404
    assert http.get("/metrics/backlog/dear/nope").status_code == 404

    # Real workers run real jobs and measure what they cost.
    worker = "costs"
    stack.start_worker("cheap,dear,paced", name=worker)
    generate = {"model": "paced", "inputs": {"prompt": "a b"}, "parameters": {"max_tokens": 20}}
    ids = asyncio.run(
        submit(stack.base_url, batch_jobs("cheap", 10) + batch_jobs("dear", 10) + [generate] * 4)
    )
    until(lambda: all(client.hget(KEYS.job(i), "status") == b"succeeded" for i in ids), 60)
    pools = ("cheap", "dear", "paced")
    until(lambda: all(client.exists(KEYS.service_cost(m, "default")) for m in pools), 10)
    stack.stop_process(worker)  # the measurement outlives the pool: it is scaled to zero now

    asyncio.run(submit(stack.base_url, batch_jobs("cheap", QUEUED) + batch_jobs("dear", QUEUED)))
    views = {m: http.get(f"/metrics/backlog/{m}/default").json() for m in ("cheap", "dear")}
    paced = http.get("/metrics/backlog/paced/default").json()
    exported = http.get("/metrics").text
    print({m: (v["seconds_per_unit"], v["backlog_seconds"]) for m, v in views.items()}, paced)

    # What the workers measured: tenfold job costs, and a generate pool's cost per token.
    assert all(v["measured"] and v["entries"] == QUEUED for v in views.values())
    cost_ratio = views["dear"]["seconds_per_unit"] / views["cheap"]["seconds_per_unit"]
    assert 5 < cost_ratio < 12, cost_ratio
    assert paced["measured"] and paced["unit"] == "token"
    assert paced["units_per_job"] == MAX_TOKENS
    assert STEP_MS / 1000 <= paced["seconds_per_unit"] < 3 * STEP_MS / 1000

    # Stream length sees two equal pools; backlog seconds sees tenfold different ones.
    lengths = {
        m: read_metric(client, StreamTrigger(KEYS.queue(m, "default"), "streamLength", 32, 0, None))
        for m in ("cheap", "dear")
    }
    assert lengths["cheap"].value == lengths["dear"].value == QUEUED
    counts: dict[str, int] = {}
    for model, view in views.items():
        config = repository.get(model)
        assert config is not None
        seconds = view["backlog_seconds"]
        assert gauge(exported, model) == pytest.approx(seconds, rel=1e-6)  # one formula
        assert backlog_reading(client, config) == pytest.approx(seconds, rel=1e-6)
        # start_worker only names the worker: the decision is what is under test
        scaler = PoolScaler.for_partition(
            config, "default", KEYS, str, lambda _: None, lambda _: True
        )
        counts[model] = scaler.tick(client)
        # the HPA's AverageValue rule, on the whole thousandths KEDA sends it
        assert counts[model] == math.ceil(int(seconds * 1000) / int(TARGET_S * 1000))
    backlog_ratio = views["dear"]["backlog_seconds"] / views["cheap"]["backlog_seconds"]
    print(f"replicas {counts}, backlog ratio {backlog_ratio:.2f}")
    assert counts["dear"] / counts["cheap"] == pytest.approx(backlog_ratio, rel=0.15)
    http.close()
    client.close()


async def test_no_more_replicas_than_jobs_however_dear_each_is(redis_client, aredis):
    """A job runs on one replica: one queued 20 s job with a 5 s target asked for four replicas,
    three of them idle. The pool scales on its backlog seconds, at most `target_s` per job;
    its seconds of work are still reported whole."""
    config = ModelConfig.model_validate(batch_model("slow", backlog={"target_s": 5}))
    pipe = redis_client.pipeline()
    queue_cost_write(pipe, KEYS, "slow", "default", ServiceCost(20.0))
    pipe.execute()
    scaler = PoolScaler.for_partition(config, "default", KEYS, str, lambda _: None, bool)
    for queued in (1, 3, 12):
        enqueue(redis_client, KEYS.queue("slow", "default"), queued - xlen(redis_client))
        (backlog,) = await read_backlogs(aredis, KEYS, [(config, "default")])
        view = backlog.view()
        assert (view["backlog_seconds"], view["scaling_seconds"]) == (20.0 * queued, 5 * queued)
        assert scaler.tick(redis_client) == queued  # four per job, before


def xlen(client: redis.Redis) -> int:
    return int(client.xlen(KEYS.queue("slow", "default")))


async def test_a_queued_job_of_a_fast_model_reads_as_work(redis_client, aredis):
    """KEDA's metrics-api activates a pool on `backlog_seconds` above 0: the producer's JSON
    rounded it to the microsecond, so one queued job of a model measured at 0.3 µs per job
    (an identity engine's full micro-batch) read 0.0, and a pool at zero replicas never woke;
    the gauge and the local autoscaler read it unrounded."""
    config = ModelConfig.model_validate(batch_model("fast"))
    pipe = redis_client.pipeline()
    queue_cost_write(pipe, KEYS, "fast", "default", ServiceCost(3e-7))
    pipe.execute()
    enqueue(redis_client, KEYS.queue("fast", "default"), 1)
    (backlog,) = await read_backlogs(aredis, KEYS, [(config, "default")])
    view = backlog.view()
    assert view["entries"] == 1 and view["measured"]
    assert view["backlog_seconds"] == backlog_reading(redis_client, config) == pytest.approx(3e-7)
