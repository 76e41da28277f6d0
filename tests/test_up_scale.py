"""`conveyor up --producers N --workers-per-model M`: several producer processes share the one
port, each answering as itself (its own instance id, hence its own reply channel), and jobs flow
through them; one killed is restarted while the other keeps serving. Bad counts are refused."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from conveyor.cli import main
from conveyor.commands.up import examples, workers_by_model
from conveyor.embedded_valkey import io_threads
from conveyor.local_stack import StackState
from conveyor.stack import ChildExited, ChildTooSlow, Stack, free_port
from shared.model_repository import ModelRepository
from tests.conftest import REPO_ROOT, until
from tests.up_process import BANNER_END, CONVEYOR, Up, conveyor_up

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    own = ("CONVEYOR_REDIS_URL", "CONVEYOR_STATE_DIR", "CONVEYOR_INSTANCE_ID")
    env = {k: v for k, v in os.environ.items() if k not in own}
    # every run here ends by stopping its workers: a read of 0.1 s, not 1 s, lets them notice
    return {**env, "CONVEYOR_AUTH": "disabled", "CONVEYOR_BLOCK_MS": "100"}


@pytest.fixture
def fresh() -> Iterator[httpx.Client]:
    """A client that opens a new connection for every request (it keeps none alive), as a
    call of `httpx.get` does, without the TLS context each of those builds (50 ms a request,
    seconds over a test's hundreds)."""
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


def _answering(fresh: httpx.Client, up: Up) -> str:
    """The instance id of the producer that takes a new connection."""
    instance: str = fresh.get(f"{up.url}/healthz", timeout=10).json()["instance"]
    return instance


def _seen_all(fresh: httpx.Client, up: Up, ids: set[str]) -> bool:
    seen = {_answering(fresh, up) for _ in range(40)}
    assert seen <= ids, seen  # never a stranger
    return seen == ids


def _predict(fresh: httpx.Client, up: Up, n: int) -> None:
    """A submit-and-wait identity job on a fresh connection; its output is its input."""
    url = f"{up.url}/v1/models/identity/predict"
    response = fresh.post(url, json={"inputs": {"n": n}}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == {"n": n}


def _submitted(fresh: httpx.Client, up: Up) -> int:
    """Identity jobs accepted, as one scrape of `/metrics` (on a new connection) counts them."""
    text = fresh.get(f"{up.url}/metrics", timeout=10).text
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "conveyor_jobs_submitted_total"
            and sample.labels["model"] == "identity"
        )
    )


def _producer_pid(instance: str) -> int:
    for process in psutil.process_iter(["cmdline"]):
        if "conveyor.producer_server" in " ".join(process.info["cmdline"] or []):
            try:
                if process.environ().get("CONVEYOR_INSTANCE_ID") == instance:
                    return process.pid
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                continue
    raise AssertionError(f"no producer process {instance}")


def _exited(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet with no thread left: either way its
    sockets are closed. (Its main thread reads as a zombie while other threads still exit, and
    they still hold its socket: a connection the kernel queued there was then reset.)"""
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE and process.num_threads() <= 1
    except psutil.NoSuchProcess:
        return True


def test_two_producers_share_the_port_and_one_killed_is_restarted(
    tmp_path: Path, fresh: httpx.Client
) -> None:
    options = ("--producers", "2", "--workers-per-model", "2")
    env = {**_env(), "CONVEYOR_HOST": "0.0.0.0"}  # every address: it was ignored (loopback only)
    with conveyor_up(tmp_path, "identity", env, options=options) as up:
        banner = "".join(up.lines)
        assert "(2 processes), workers for identity (2)." in banner
        state = StackState.read(tmp_path)
        assert state is not None
        up_pid = state.pid
        setting = redis.Redis.from_url(state.redis_url, decode_responses=True).config_get("io-*")
        assert setting["io-threads"] == str(io_threads())  # this machine's share
        ids = {f"up-{up_pid}-1", f"up-{up_pid}-2"}
        until(lambda: _seen_all(fresh, up, ids), timeout=60)
        for n in range(30):  # each on a new connection: the kernel spreads them over both
            _predict(fresh, up, n)
        # whichever process a scrape reaches answers for both: it answered with its own share
        assert [_submitted(fresh, up) for _ in range(6)] == [30] * 6
        # the instance ids are the processes' own: each waits on its own reply channel
        first = _producer_pid(f"up-{up_pid}-1")
        listening = psutil.Process(first).net_connections(kind="tcp")
        assert {c.laddr.ip for c in listening if c.status == psutil.CONN_LISTEN} == {"0.0.0.0"}
        os.kill(first, signal.SIGKILL)
        # Until it has exited, its socket is still in the port's group: the kernel may queue a
        # new connection there, which the exit then resets (the client's to retry).
        until(lambda: _exited(first), timeout=30)
        for n in range(10):  # the other one keeps serving
            _predict(fresh, up, n)
        until(lambda: any("producer-1: restarted" in line for line in up.lines), timeout=60)
        until(lambda: _seen_all(fresh, up, ids), timeout=60)
        assert _producer_pid(f"up-{up_pid}-1") != first
        for n in range(10):
            _predict(fresh, up, n)
        assert [_submitted(fresh, up) for _ in range(6)] == [50] * 6  # the killed one's count stays


def _up_refused(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONVEYOR), "up", *args, "--state-dir", str(tmp_path)],
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--producers", "0"),
        ("--producers", "two"),
        ("--workers-per-model", "-1"),
        ("--port", "70000"),  # was a traceback from bind()
    ],
)
def test_bad_process_counts_are_refused(tmp_path: Path, option: str, value: str) -> None:
    """In-process, as the `conveyor` entry point runs `main` (click's usage error is exit 2, an
    uncaught exception exit 1): a process per case cost seconds of imports and proved no more."""
    result = CliRunner().invoke(main, ["up", option, value, "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert f"Invalid value for '{option}'" in result.stderr, result.stderr
    assert not (tmp_path / "valkey").exists()  # refused before starting anything


@pytest.mark.parametrize("models", ["", "identity,"])
def test_an_empty_model_name_is_refused(
    tmp_path: Path, settings_env: Callable[..., None], models: str
) -> None:
    """`--models ""` (a script's unset variable) started every model, an LLM too. A Redis that
    does not answer: what it would start, were the name let through, stops there. In-process,
    as test_bad_process_counts_are_refused."""
    settings_env(CONVEYOR_REDIS_URL="redis://127.0.0.1:1/0")
    args = ["up", "--models", models, "--port", str(free_port()), "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.stderr, result.exception)
    said = f"Invalid value for '--models': {models!r} has an empty model name"
    assert said in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("CONVEYOR_PRODUCER_PROCESSES", "0", "Input should be greater than or equal to 1"),
        ("CONVEYOR_PORT", "99999", "Input should be less than or equal to 65535"),
        ("CONVEYOR_REDIS_URL", "http://x", "must start with one of redis://, rediss://, unix://"),
        ("CONVEYOR_LOG_LEVEL", "chatty", "must be one of CRITICAL, DEBUG, ERROR, FATAL, INFO"),
    ],
)
def test_a_bad_setting_is_one_clear_line(
    tmp_path: Path, name: str, value: str, problem: str
) -> None:
    """A port out of range and a Redis URL of another scheme used to start and then die with a
    traceback (bind's OverflowError; a producer that "exited before it answered")."""
    result = _up_refused(tmp_path, [], {name: value})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert f"bad setting: {name}=" in result.stderr and problem in result.stderr, result.stderr
    assert not (tmp_path / "valkey").exists()


def test_a_cluster_without_its_url_is_refused_before_starting(tmp_path: Path) -> None:
    """The embedded Valkey is one server, not a cluster: it started, and the cluster client
    sent to it ended `conveyor up` with a traceback."""
    result = _up_refused(tmp_path, ["--port", str(free_port())], {"CONVEYOR_REDIS_CLUSTER": "1"})
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: CONVEYOR_REDIS_CLUSTER=1 needs CONVEYOR_REDIS_URL, a node of the cluster: "
        "the embedded Valkey is a single server"
    ), result.stderr
    assert not (tmp_path / "valkey").exists()


@pytest.mark.parametrize(
    "entry",
    [
        ["python", "-m", "conveyor.producer_server"],
        ["celery", "-A", "workers.app", "worker"],
    ],
)
def test_a_bad_setting_ends_a_process_started_as_compose_and_k8s_start_it(
    entry: list[str],
) -> None:
    """The CLI's one line, from the commands the manifests run: a traceback that named the
    field (`port`), not the variable."""
    command = [str(Path(CONVEYOR).parent / entry[0]), *entry[1:]]
    env = {**os.environ, "CONVEYOR_PORT": "99999"}
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "Error: bad setting: CONVEYOR_PORT='99999': Input should be less than or equal to 65535"
    )


def test_an_address_this_machine_lacks_is_refused_before_starting(tmp_path: Path) -> None:
    result = _up_refused(tmp_path, [], {"CONVEYOR_HOST": "999.1.1.1"})
    assert result.returncode == 1
    assert "Error: cannot listen on 999.1.1.1:8000 (" in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith("check CONVEYOR_HOST"), result.stderr
    assert not (tmp_path / "valkey").exists()


def test_a_redis_it_cannot_reach_is_refused_before_starting(tmp_path: Path) -> None:
    """It waited, silently, for producers that could never get ready."""
    args = ["--port", str(free_port())]
    result = _up_refused(tmp_path, args, {"CONVEYOR_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode == 1
    assert "Error: cannot reach Redis at redis://127.0.0.1:1/0 (" in result.stderr, result.stderr
    assert result.stderr.rstrip().endswith("check CONVEYOR_REDIS_URL"), result.stderr
    assert not (tmp_path / "producer.log").exists()


def test_default_workers_split_the_cores_over_batch_models_and_an_llm_gets_one() -> None:
    repository = ModelRepository.load(REPO_ROOT / "model_repository")
    models = ["identity", "minilm:default", "smollm2"]
    assert workers_by_model(repository, models, 4, None, cores=16) == {
        "identity": 6,
        "minilm:default": 6,
        "smollm2": 1,
    }
    assert workers_by_model(repository, models, 4, 3, cores=16) == dict.fromkeys(models, 3)
    # two cores: one of each, as before
    assert workers_by_model(repository, models, 1, None, cores=2) == dict.fromkeys(models, 1)


def test_the_embedded_valkey_gets_io_threads_from_eight_cores() -> None:
    """Below 8 cores the server keeps to its main thread; from 8, a quarter of the cores read,
    parse and write for it, at most 4 (producers and workers need the rest)."""
    cores = (1, 2, 4, 7, 8, 12, 16, 64)
    assert [io_threads(n) for n in cores] == [1, 1, 1, 1, 2, 3, 4, 4]


def test_the_banner_shows_a_request_for_a_served_model_only() -> None:
    both = examples(["identity:canary", "minilm"], "http://h", "")
    assert '"model": "identity"' in both and "http://h/v1/models/minilm/predict" in both
    assert "chat/completions" not in both  # smollm2 is not served
    own = examples(
        ["ab"], "http://h", ""
    )  # a model of the user's own: its name, no invented inputs
    assert "submit to ab (inputs as its config.yaml's input_schema says)" in own
    assert '"model": "ab", "inputs": {...}' in own and "identity" not in own


def test_a_producer_that_dies_while_starting_says_why(stack: Stack, tmp_path: Path) -> None:
    """Its own last lines, not the waiting process's traceback (`conveyor up` prints this)."""
    mine = Stack.create(tmp_path, stack.redis_url)  # the session's Redis; its own processes
    try:
        with pytest.raises(ChildExited) as exited:
            mine.start_producers(free_port(), 1, "doomed", CONVEYOR_MODEL_REPOSITORY="/nowhere")
    finally:
        mine.stop()
    message = str(exited.value)
    assert message.startswith(f"producer exited before it was ready; the end of {tmp_path}/")
    assert "model repository /nowhere is not a directory" in message, message


def test_a_worker_that_dies_while_starting_says_why(tmp_path: Path) -> None:
    """`conveyor up` printed its own traceback ("RuntimeError: worker broken exited with 1; see
    var/run") and left the reason in the worker's log. The workers start side by side: the one
    named after the broken one was started too (and stopped)."""
    repository = tmp_path / "repository"
    (repository / "broken").mkdir(parents=True)
    (repository / "broken" / "config.yaml").write_text(
        "kind: batch\nbackend: no_such_package.engines:Engine\n"
    )
    shutil.copytree(REPO_ROOT / "model_repository" / "identity", repository / "identity")
    # the broken one is made to exit this long after its failed start (status 70): left to
    # Celery, its exit took 2 s more
    env = {"CONVEYOR_MODEL_REPOSITORY": str(repository), "CONVEYOR_FORCED_EXIT_MARGIN_S": "0.5"}
    result = _up_refused(tmp_path, ["--models", "broken,identity", "--port", str(free_port())], env)
    assert (tmp_path / "identity.log").exists(), result.stderr
    assert result.returncode == 1
    assert "Traceback" not in result.stderr.split("the end of", 1)[0], result.stderr
    assert f"Error: broken exited before it was ready; the end of {tmp_path}/" in result.stderr
    assert "backend 'no_such_package.engines:Engine': cannot import" in result.stderr, result.stderr


def test_sigterm_while_starting_stops_what_has_started(tmp_path: Path) -> None:
    """`conveyor up` ended by SIGTERM while it started its workers (`timeout`, a service
    manager) left Valkey, the producer and the workers running: they live in sessions of their
    own, and Python's default SIGTERM ends a process without its `finally`."""
    up = _identity_up(tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # the worker is starting: its log is made before it is spawned, and a child caught
        # between its fork and its exec still shows `conveyor up`'s command line
        until(lambda: any("celery" in name for name in _command_lines(up.pid)), 120)
        started = psutil.Process(up.pid).children(recursive=True)
        names = _command_lines(up.pid)
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=90)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # as Ctrl-C: a SIGKILL would orphan its children
            up.wait(timeout=90)
    assert code == 128 + signal.SIGTERM
    assert any("valkey" in name for name in names) and any("celery" in name for name in names)
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [process.cmdline() for process in alive]


def _command_lines(pid: int) -> set[str]:
    """The command lines of the process's descendants, leaving out any that exits meanwhile."""
    lines = set()
    for process in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            lines.add(" ".join(process.cmdline()))
    return lines


def test_a_child_slower_than_the_start_timeout_says_so(stack: Stack, tmp_path: Path) -> None:
    """A worker still loading after 300 s (a large LLM may take longer) was a TimeoutError
    traceback in `conveyor up`; the wait is CONVEYOR_START_TIMEOUT_S (`Stack.start_timeout_s`),
    and running out of it names the child and shows the end of its log."""
    (tmp_path / "repository" / "slow").mkdir(parents=True)
    (tmp_path / "repository" / "slow" / "config.yaml").write_text(
        "kind: generate\nbackend: tests.paced_engine:PacedEngine\nparameters: {load_ms: 600000}\n"
    )
    mine = Stack.create(tmp_path, stack.redis_url)  # the session's Redis; its own processes
    mine.start_timeout_s = 1  # the worker never gets ready: how long is not the point
    try:
        with pytest.raises(ChildTooSlow) as slow:
            mine.start_worker(
                "slow",
                CONVEYOR_MODEL_REPOSITORY=str(tmp_path / "repository"),
                PYTHONPATH=str(REPO_ROOT),
            )
    finally:
        mine.stop_process("slow", signal.SIGKILL)  # no need to wait for its drain
        mine.stop()
    message = str(slow.value)
    assert message.startswith(
        f"slow was not ready after 1s (CONVEYOR_START_TIMEOUT_S); the end of {tmp_path}/slow.log"
    ), message


def test_the_start_timeout_holds_from_the_embedded_valkey_on(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """`Stack.create` waited for its embedded Valkey (loading its data files) 300 s whatever
    CONVEYOR_START_TIMEOUT_S said: `conveyor up` set the stack's timeout only afterwards."""
    settings_env(CONVEYOR_START_TIMEOUT_S="900")
    assert Stack.create(tmp_path, "redis://127.0.0.1:1/0").start_timeout_s == 900


def _kill_producers(up: psutil.Process) -> None:
    for child in up.children():
        with contextlib.suppress(psutil.Error):  # gone, a zombie, not yet exec'd
            if "conveyor.producer_server" in " ".join(child.cmdline()):
                child.kill()


def test_a_child_given_up_on_fails_the_run(tmp_path: Path) -> None:
    """A child that kept dying was reported once, then `conveyor up` served on without it and
    exited 0 on Ctrl-C: a script or a service manager saw a clean run."""
    up = _identity_up(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    threading.Thread(target=lines.extend, args=(up.stdout,), daemon=True).start()
    try:
        until(lambda: any(BANNER_END in line for line in lines), 180)

        def given_up() -> bool:
            _kill_producers(psutil.Process(up.pid))  # again each time it is restarted
            return any(line.startswith("producer: failed") for line in lines)

        until(given_up, timeout=120, every=0.2)
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=90)
    assert code == 1, "".join(lines)
    assert "Error: gave up on producer after repeated exits" in lines[-1], "".join(lines)


def _identity_up(state_dir: Path, **output: Any) -> subprocess.Popen[str]:
    """`conveyor up` serving identity on a free port from `state_dir`, its output as asked."""
    command = [str(CONVEYOR), "up", "--models", "identity", "--port", str(free_port())]
    return subprocess.Popen(
        [*command, "--state-dir", str(state_dir)], env=_env(), text=True, **output
    )
