"""Shared fixtures: one real Redis-protocol server per test session (embedded Valkey unless
CONVEYOR_REDIS_URL points at one), and a clean keyspace per test."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio import RedisCluster
from xdist.scheduler import LoadFileScheduling

from conveyor.embedded_valkey import start_embedded_valkey
from conveyor.stack import Stack, free_port
from conveyor.valkey_cluster import LocalCluster, local_cluster
from shared import job_scripts
from shared.api_keys import ApiKeyStore, KeySpec
from shared.job_states import TERMINAL
from shared.keys import Keys
from shared.model_repository import ModelConfig, ModelRepository
from shared.redis_client import RedisClient, connect, preload
from shared.redis_clock import CLOCK, Skew
from shared.settings import get_settings
from workers.engines.registry import create_engine
from workers.engines.vllm_engine import VllmEngine
from workers.model_prep.smollm2 import prepare as prepare_smollm2

pytest_plugins = ["tests.hang_guard", "tests.webhook_receiver_fixture"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """A run started in the background of a shell without job control (`make test &` in a
    script) inherits SIGINT ignored, and so did every process it started: `conveyor up` keeps an
    ignored SIGINT ignored (as under nohup), so the tests' Ctrl-C stopped nothing, each `up`
    waited out its 60 s and the tests failed. Its children get SIGINT's default, as from a
    terminal (a handler, unlike SIG_IGN, is reset by exec)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The session fixtures of the shared smollm2 (vLLM: an engine and a worker, a minute or more of
# both cores each to start), and the modules whose tests use them: under `make test`'s xdist
# workers they all run on one (`ModulesAndSmollm2`), where each worker would start its own;
# with them the one that starts an engine of its own, so that no more vLLM engines run at once
# than one process ran (each holds gigabytes).
SHARED_SMOLLM2 = frozenset({"smollm2_engine", "smollm2_worker"})
SHARED_SMOLLM2_MODULES = frozenset(
    f"tests/{name}.py"
    for name in (
        "test_engine_edges_token_limits",
        "test_generate_quiet_cancel",
        "test_generate_r11_tokenising",
        "test_generate_r35_held_back_tpot",
        "test_generate_sampling",
        "test_generate_token_counts",
        "test_llm_engine",
        "test_llm_pipeline",
        "test_llm_streaming_benchmark",
        "test_openai_compat_shapes",
        "test_readme_curls",
    )
)


class ModulesAndSmollm2(LoadFileScheduling):
    """`make test`'s xdist schedule (its tests mostly wait on the processes they start): a
    module's tests on one worker, its module fixtures (a Valkey Cluster) made once, and every
    module of SHARED_SMOLLM2_MODULES on one worker too. xdist's own `xdist_group` marks do not
    group under pytest 9.2, whose node ids xdist 3.8 can no longer rename."""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return "smollm2" if module in SHARED_SMOLLM2_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModulesAndSmollm2:
    return ModulesAndSmollm2(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A module using the shared smollm2 that SHARED_SMOLLM2_MODULES does not name stops the run:
    scheduled apart, it would start a second one beside the first."""
    unnamed = {
        item.nodeid.split("::")[0]
        for item in items
        if SHARED_SMOLLM2 & set(getattr(item, "fixturenames", ()))
    } - SHARED_SMOLLM2_MODULES
    if unnamed:
        raise pytest.UsageError(
            f"{sorted(unnamed)} use the shared smollm2: name them in SHARED_SMOLLM2_MODULES "
            "(tests/conftest.py)"
        )


@pytest.fixture(autouse=True)
def uncorrected_clock() -> Iterator[None]:
    """The process's clock uncorrected after each test, as before any measure: a skew adopted
    in one (a host run off Redis's clock, a producer's `redis-clock` loop or a heartbeat that
    measured a patched clock) stamped every later test's jobs off by as much."""
    yield
    CLOCK.adopt(Skew(0.0, 0.0))


@pytest.fixture(scope="session", autouse=True)
def vllm_cpu_unbound() -> Iterator[None]:
    """vLLM on a CPU binds its model process's OpenMP threads to the cores it does not reserve
    (`VLLM_CPU_OMP_THREADS_BIND=auto`): one core of two here, the same one for every engine, so
    the session's two smollm2 starts (its in-process engine and its worker, side by side) took
    turns on it, 150 s against 80 s unbound. Set for the session, before any engine or worker
    starts; what the tests check does not depend on it (`make bench` and `conveyor up` keep vLLM's
    binding)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        yield


@pytest.fixture(scope="session")
def smollm2_config() -> ModelConfig:
    config = ModelRepository.load(REPO_ROOT / "model_repository").get("smollm2")
    assert config is not None
    return config


@pytest.fixture(scope="session")
def smollm2_artifacts(smollm2_config: ModelConfig) -> Path:
    """Prepared once per machine (cached); `make models` usually did it already."""
    root = REPO_ROOT / get_settings().artifact_dir
    prepare_smollm2(smollm2_config, root / "smollm2", False)
    return root


@pytest.fixture(scope="session")
async def smollm2_engine(
    smollm2_config: ModelConfig, smollm2_artifacts: Path, stack: Stack
) -> AsyncIterator[VllmEngine]:
    """One in-process vLLM engine on SmolLM2 for the whole session: starting one (engine-core
    process, weights, KV cache) takes tens of seconds on the CPU. The shared stack's smollm2
    worker, which the pipeline tests compare with it, starts beside it (`serve` waits for it):
    each start is mostly one process importing at a time, so two overlap on two cores."""
    if "smollm2" not in stack.processes:
        stack.spawn_worker("smollm2")
    engine = await started_vllm(smollm2_config, smollm2_artifacts)
    yield engine
    await engine.close()


async def started_vllm(config: ModelConfig, artifacts: Path) -> VllmEngine:
    """`config`'s default variant loaded and warmed up on vLLM from prepared `artifacts`."""
    engine = create_engine(config, "default", artifacts)
    assert isinstance(engine, VllmEngine)
    await engine.load()
    await engine.warmup()
    return engine


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("CONVEYOR_REDIS_URL")
    if external:
        yield external
        return
    with own_valkey() as url:
        yield url


@contextmanager
def own_valkey() -> Iterator[str]:
    """The URL of an embedded Valkey of the caller's own (what a test changes or empties is
    server-wide), stopped on the way out."""
    server = start_embedded_valkey()
    try:
        yield server.connection_url
    finally:
        server.stop()


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Sets `CONVEYOR_` variables for one test (`settings_env(CONVEYOR_X="1")`): the settings
    are read anew then, and again after the test, without them."""

    def apply(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    yield apply
    monkeypatch.undo()
    get_settings.cache_clear()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real local Valkey Cluster (3 masters, 3 replicas) for one test module."""
    with local_cluster(tmp_path_factory.mktemp("cluster")) as formed:
        yield formed


@pytest.fixture
async def cluster_client(cluster: LocalCluster) -> AsyncIterator[RedisClient]:
    """An asyncio cluster client with the job scripts loaded on every node, as the app has."""
    nodes = RedisCluster.from_url(f"redis://127.0.0.1:{cluster.masters[0].port}/0")
    client = cast(RedisClient, nodes)  # as shared.redis_client.connect types it
    await preload(client, job_scripts.ALL)
    yield client
    await nodes.aclose()


@contextmanager
def running_stack(
    folder: Path,
    valkey_config: dict[str, str] | None = None,
    workers: tuple[str, ...] = (),
    **env: str,
) -> Iterator[Stack]:
    """Its own embedded Valkey and a producer on a free port, with `env` set for every process
    it starts, and `workers` (models as `start_worker` takes them) ready; stopped (workers
    included) on the way out. The workers start beside the producer: each start is mostly one
    process importing, seconds a test would otherwise wait twice."""
    pipeline = Stack.create(folder, valkey_config=valkey_config)
    pipeline.env.update(env)
    try:
        names = [pipeline.spawn_worker(models) for models in workers]
        pipeline.start_producer(free_port())
        pipeline.wait_ready(*names)
        yield pipeline
    finally:
        pipeline.stop()


@pytest.fixture
def bare_stack(tmp_path: Path) -> Iterator[Stack]:
    """A Valkey of the test's own and nothing else yet: for a test that changes what is
    server-wide (its maxmemory)."""
    own = Stack.create(tmp_path / "bare-stack")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A real pipeline: its own embedded Valkey and a producer on a free port; tests add workers."""
    # these tests are not about keys (test_auth is)
    with running_stack(tmp_path_factory.mktemp("stack"), CONVEYOR_AUTH="disabled") as pipeline:
        yield pipeline


@pytest.fixture(scope="session")
def smollm2_worker(stack: Stack) -> None:
    """The shared stack's smollm2 worker (vLLM), started by the first test that needs it, or
    spawned beside the in-process engine (`smollm2_engine`) and now waited for."""
    serve(stack, "smollm2")


@pytest.fixture(scope="session")
def base_url(stack: Stack) -> str:
    return stack.base_url


@pytest.fixture(scope="session")
def identity_worker(stack: Stack) -> int:
    return stack.start_worker("identity:default")


@pytest.fixture(scope="session")
def minilm_worker(stack: Stack) -> int:
    return stack.start_worker("minilm")


@pytest.fixture
def stack_redis(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def auth_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A pipeline with API keys enforced, as in production (auth, rate-limit and fuzz tests)."""
    with running_stack(tmp_path_factory.mktemp("auth-stack"), CONVEYOR_AUTH="enabled") as pipeline:
        yield pipeline


def issue_key(redis_url: str, tenant: str, *scopes: str, **spec: Any) -> str:
    """Store a new API key on the server at `redis_url` and return it in plain text:
    issue_key(url, "acme", "submit", "read", max_in_flight=5)."""

    async def create() -> str:
        client = connect(redis_url)
        try:
            key_spec = KeySpec(tenant=tenant, scopes=frozenset(scopes), **spec)
            key, _ = await ApiKeyStore(client, Keys()).create(key_spec)
            return key
        finally:
            await client.aclose()

    return asyncio.run(create())


def serve(stack: Stack, model: str) -> None:
    """One worker for `model` on a shared stack, started by whichever test needs it first (or
    spawned by a fixture before, and now waited for)."""
    if model not in stack.processes:
        stack.start_worker(model)
    elif model in stack.readiness:
        stack.wait_ready(model)


def until(check: Callable[[], Any], timeout: float = 30, every: float = 0.1) -> Any:
    """`check()`'s first truthy value, polled every `every` seconds for up to `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every)
    raise AssertionError(f"not true after {timeout}s")


def ended(job_url: str, within_s: float = 180) -> dict[str, Any]:
    """The job at `job_url` once it ends, over as many 30 s long polls as it takes: one poll's
    30 s is too short for a job a worker must first be started or take over to run on a loaded
    2-core CI machine. Raises if it is still open after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        job: dict[str, Any] = httpx.get(job_url, params={"wait": 30}, timeout=45).json()
        if job["status"] in TERMINAL:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"still {job['status']} after {within_s}s: {job}")


async def until_async(
    check: Callable[[], Awaitable[Any]], timeout: float = 30, every: float = 0.1
) -> Any:
    """`until()` for a check that must run on the test's event loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := await check():
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"not true after {timeout}s")
