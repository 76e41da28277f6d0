"""`conveyor autoscale`: its decisions tick by tick on a real stream (KEDA's step to zero, the
HPA's scale-down window), its pools and worker names, how it starts and stops workers without
waiting on them, its backoff for workers that keep dying (CrashLoopBackOff), one autoscaler per
pool (its lease) and per state dir; and on a real pipeline, a burst scales the pool up to its
max, an empty queue scales it back to zero after the cooldown, every job succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count, islice, pairwise
from pathlib import Path

import httpx
import pytest
import redis
from redis.exceptions import ClusterDownError, RedisClusterException

from autoscaling.local_autoscaler import PoolScaler, pool_scalers
from autoscaling.scaling_math import StreamTrigger
from conveyor.commands.autoscale import PoolWorkers, _tick
from conveyor.stack import ChildTooSlow, Stack
from shared.keys import GROUP, Keys
from shared.model_repository import ModelRepository
from shared.restart_backoff import MAX_BACKOFF_S, STABLE_AFTER_S
from tests.conftest import REPO_ROOT, running_stack, until

KEYS = Keys("cv:")

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "model_repository"
AUTOSCALE = [str(Path(sys.executable).parent / "conveyor"), "autoscale", "--models", "elastic"]
STREAM = "autoscale-test"
LEASE_MS = 60_000
NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis
# A model whose engine cannot load (its module is missing): each of its workers dies at start-up.
BROKEN = "kind: batch\nbackend: tests.no_such_engine:Engine\ninput_schema: {type: object}\n"
# A worker that drains until the test lets it go: it says `ready` once SIGTERM is handled, `term`
# when one comes, and runs on until `release` exists; then it says `exit` and exits 0.
DRAINER = """
import pathlib, signal, sys, time
here = pathlib.Path(sys.argv[1])
state = here / "state"
signal.signal(signal.SIGTERM, lambda *_: state.write_text("term"))
state.write_text("ready")
while not (here / "release").exists():
    time.sleep(0.05)
state.write_text("exit")
"""


@dataclass
class Ledger:
    """Stand-in worker processes for a scaler ticked by hand: the names it starts and stops."""

    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)

    def start(self, name: str) -> str:
        self.started.append(name)
        return name

    def stop(self, names: list[str]) -> None:
        self.stopped.extend(names)

    def alive(self, name: str) -> bool:
        return name not in self.stopped


@dataclass
class CrashingLedger(Ledger):
    """Stand-in workers that, while `crashing`, have each exited by the next poll."""

    crashing: bool = True

    def alive(self, name: str) -> bool:
        return not self.crashing and super().alive(name)


@dataclass
class OutageScaler(PoolScaler):
    """A pool whose polls meet a Redis outage: each tick raises the next of `outages`."""

    outages: list[Exception] = field(default_factory=list)

    def tick(self, client: redis.Redis, now: float | None = None) -> int:
        raise self.outages.pop(0)


def _scaler(
    ledger: Ledger, name: str = "elastic:default", window_s: float = 60.0, cooldown_s: float = 60.0
) -> PoolScaler:
    """A pool of 0 to 4 replicas on one `streamLength` trigger of 64 entries per replica."""
    trigger = StreamTrigger.from_metadata({"stream": STREAM, "streamLength": "64"})
    lease_key = KEYS.autoscale_leader(*name.split(":"))
    start, stop, alive = ledger.start, ledger.stop, ledger.alive
    return PoolScaler(
        name, [trigger], 0, 4, cooldown_s, window_s, start, stop, alive, lease_key, LEASE_MS
    )


def _queue(client: redis.Redis, entries: int, stream: str = STREAM) -> None:
    """Exactly `entries` entries in the stream."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(stream)
    for _ in range(entries):
        pipe.xadd(stream, {"job": "x"})
    pipe.execute()


def test_scale_down_waits_out_the_window_while_work_is_queued(redis_client: redis.Redis) -> None:
    """The HPA scales 4 -> 1 once one replica's worth (30 of 64) has been all it asked for over
    its stabilization window; the autoscaler never scaled down while anything was queued."""
    ledger = Ledger()
    scaler = _scaler(ledger, window_s=60.0)
    _queue(redis_client, 256)
    assert scaler.tick(redis_client, now=0.0) == 4
    _queue(redis_client, 30)
    assert [scaler.tick(redis_client, now=t) for t in (10.0, 30.0, 59.0)] == [4, 4, 4]
    assert [scaler.tick(redis_client, now=t) for t in (61.0, 62.0, 63.0, 64.0)] == [3, 2, 1, 1]
    assert ledger.stopped == ledger.started[:0:-1]  # the newest first, one per tick


def test_a_pool_goes_to_zero_only_after_cooldown_without_activity(
    redis_client: redis.Redis,
) -> None:
    """KEDA's cooldownPeriod gates the step to zero alone: the HPA holds one replica until then."""
    scaler = _scaler(Ledger(), window_s=0.0, cooldown_s=60.0)
    _queue(redis_client, 1)
    assert scaler.tick(redis_client, now=0.0) == 1
    _queue(redis_client, 0)
    assert scaler.tick(redis_client, now=59.0) == 1
    assert scaler.tick(redis_client, now=60.0) == 0


def test_the_backoff_is_capped_never_gives_up_and_starts_over_after_a_long_run(
    redis_client: redis.Redis,
) -> None:
    """As Kubernetes' CrashLoopBackOff, not `conveyor up`'s give-up: a pool whose workers keep
    dying waits twice as long before each start, up to MAX_BACKOFF_S, and keeps trying (nothing
    else serves it); one that stayed up STABLE_AFTER_S ends the loop, and the next start after
    its death waits the first delay again. One poll a second."""
    ledger = CrashingLedger()
    scaler = _scaler(ledger)
    _queue(redis_client, 1)
    polls = (float(t) for t in count())
    starts = list(islice((t for t in polls if scaler.tick(redis_client, now=t)), 12))
    gaps = [later - earlier for earlier, later in pairwise(starts)]
    # each 0.5, 1, 2, 4, 8, 16, 30, 30 … s of backoff, plus the poll that saw the exit
    assert gaps == [2, 2, 3, 5, 9, 17] + [MAX_BACKOFF_S + 1] * 5, starts
    ledger.crashing = False
    up_until = starts[-1] + STABLE_AFTER_S  # the last one stays up that long, then dies
    assert scaler.tick(redis_client, now=up_until) == 1
    ledger.crashing = True
    assert scaler.tick(redis_client, now=up_until + 1.0) == 0
    assert scaler.held.startswith("backing off 0.5s more: crash loop exit 1:"), scaler.held
    assert scaler.tick(redis_client, now=up_until + 2.0) == 1


def _scale_to_zero(scaler: PoolScaler, client: redis.Redis, now: float) -> None:
    """The queue is empty, and the pool's cooldown (0 s) over: it scales its worker down."""
    _queue(client, 0)
    assert scaler.tick(client, now=now) == 0


def _step_aside(scaler: PoolScaler, client: redis.Redis, now: float) -> None:
    """Another autoscaler took the pool over, then gave it back: this one stopped its worker."""
    other = _scaler(Ledger())
    client.delete(scaler.lease_key)  # as if the lease had run out
    assert other.tick(client, now=now) == 1 and scaler.tick(client, now=now) == 0
    other.release(client)


@pytest.mark.parametrize("stop", [_scale_to_zero, _step_aside])
def test_a_long_run_stopped_ends_the_crash_loop_as_its_death_would(
    redis_client: redis.Redis, stop: Callable[[PoolScaler, redis.Redis, float], None]
) -> None:
    """A pool that crash-looped (a model file missing, then put back), then served for hours
    and was stopped (scaled to zero, or handed to another autoscaler), waited the loop's grown
    delay at the first death of its next burst, however healthy those hours: only a death
    ended the loop. Stopped after STABLE_AFTER_S up, a worker ends it too. One poll a second."""
    ledger = CrashingLedger()
    scaler = _scaler(ledger, window_s=0.0, cooldown_s=0.0)
    _queue(redis_client, 1)
    polls = (float(t) for t in count())
    starts = list(islice((t for t in polls if scaler.tick(redis_client, now=t)), 6))
    assert scaler.backoff.delay_s == 8.0, starts  # five deaths: 0.5, 1, 2, 4, 8 s
    ledger.crashing = False
    up_until = starts[-1] + STABLE_AFTER_S + 3600.0  # the last one serves for hours
    assert scaler.tick(redis_client, now=up_until) == 1
    stop(scaler, redis_client, up_until + 1.0)
    assert ledger.stopped == ledger.started[-1:]  # stopped, not dead
    morning = up_until + 12 * 3600.0
    _queue(redis_client, 1)  # the next morning's burst
    assert scaler.tick(redis_client, now=morning) == 1
    ledger.crashing = True  # its first worker dies at start, once
    assert scaler.tick(redis_client, now=morning + 1.0) == 0
    assert scaler.held.startswith("backing off 0.5s more: crash loop exit 1:"), scaler.held


def test_overlapping_selectors_give_one_scaler_per_pool() -> None:
    """`elastic,elastic:default` named one pool twice: two scalers started workers for it, each
    blind to the other's, under colliding names."""
    ledger = Ledger()
    partitions = ModelRepository.load(FIXTURES).partitions(["elastic", "elastic:default"])
    scalers = pool_scalers(
        partitions, KEYS, lambda _pool, name: name, ledger.stop, ledger.alive, LEASE_MS
    )
    assert [s.name for s in scalers] == ["elastic:default"]


def test_worker_names_of_two_pools_never_collide(redis_client: redis.Redis) -> None:
    """`a-b:c` and `a:b-c` both named their first worker `a-b-c-1`: the second replaced the
    first in the stack's processes, which then ran on untracked."""
    ledger = Ledger()
    _queue(redis_client, 1)
    for pool in ("a-b:c", "a:b-c"):
        _scaler(ledger, name=pool).tick(redis_client, now=0.0)
    assert len(set(ledger.started)) == 2, ledger.started


def test_two_autoscalers_of_one_pool_start_its_max_between_them(
    redis_client: redis.Redis,
) -> None:
    """Two `conveyor autoscale` of one pool each read its 256 queued entries and each started
    its max: the pool ran twice its max. Only the holder of the pool's lease scales it."""
    ledgers = [Ledger(), Ledger()]
    scalers = [_scaler(ledger) for ledger in ledgers]
    _queue(redis_client, 256)
    assert [scaler.tick(redis_client, now=0.0) for scaler in scalers] == [4, 0]
    assert sum(len(ledger.started) for ledger in ledgers) <= scalers[0].max_replicas
    assert [scaler.leading for scaler in scalers] == [True, False]


def test_a_pool_whose_leader_stopped_renewing_is_taken_over(redis_client: redis.Redis) -> None:
    """The other autoscaler scales the pool once the lease runs out; the former leader, back,
    stops its workers, all at once, rather than run them beside the new leader's."""
    first, second = Ledger(), Ledger()
    leader, follower = _scaler(first), _scaler(second)
    _queue(redis_client, 256)
    assert [leader.tick(redis_client, now=0.0), follower.tick(redis_client, now=0.0)] == [4, 0]
    redis_client.delete(leader.lease_key)  # as if the lease had run out
    assert follower.tick(redis_client, now=1.0) == 4
    assert leader.tick(redis_client, now=1.0) == 0
    assert first.stopped == first.started and len(second.started) == 4 and not second.stopped
    assert not leader.leading and follower.leading


def test_a_stopping_leader_hands_its_pool_over_at_once(redis_client: redis.Redis) -> None:
    """An autoscaler stopped in order (Ctrl-C) kept its lease until it lapsed: a new one
    started right after scaled nothing for a whole lease. It gives the lease up as it stops;
    a follower's release takes nothing from the leader."""
    first, second = Ledger(), Ledger()
    leader, follower = _scaler(first), _scaler(second)
    _queue(redis_client, 256)
    assert [leader.tick(redis_client, now=0.0), follower.tick(redis_client, now=0.0)] == [4, 0]
    follower.release(redis_client)
    assert follower.tick(redis_client, now=1.0) == 0 and leader.leading
    leader.release(redis_client)
    assert not leader.leading and redis_client.get(leader.lease_key) is None
    assert follower.tick(redis_client, now=2.0) == 4 and follower.leading


def test_a_redis_outage_hands_no_pool_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through a Valkey restart the lease stays with its holder: neither autoscaler stops or
    starts a worker while Redis is out, and after it only the leader scales the pool."""
    stack = Stack.create(tmp_path / "stack")
    client = stack.client()
    ledgers = [Ledger(), Ledger()]
    scalers = [_scaler(ledger) for ledger in ledgers]
    try:
        _queue(client, 256)
        for scaler in scalers:
            _tick(scaler, client)
        stack.stop_process("valkey")
        for scaler in scalers:
            _tick(scaler, client)
        assert capsys.readouterr().err.count("redis unavailable") == 2
        stack.spawn_valkey()
        for scaler in scalers:
            _tick(scaler, client)
        assert [scaler.leading for scaler in scalers] == [True, False]
        assert [len(ledger.started) for ledger in ledgers] == [4, 0]
        assert not any(ledger.stopped for ledger in ledgers)
    finally:
        client.close()
        stack.stop()


@pytest.mark.slow
def test_a_second_autoscaler_on_one_state_dir_is_refused(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """Two on one state dir (both on the default `var/autoscale`) named their workers alike
    and wrote to each other's logs."""
    env = {"CONVEYOR_REDIS_URL": redis_url, "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES)}
    process, lines = _autoscaler(env, tmp_path / "scaler", "0.5")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        second = subprocess.run(
            [*AUTOSCALE, "--state-dir", str(tmp_path / "scaler")],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        assert "another `conveyor autoscale` uses the state dir" in second.stderr, second.stderr
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_between_polls_ends_the_wait_for_the_next(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, stop: signal.Signals
) -> None:
    """The loop slept out its interval after a stop (Python resumes a sleep once the handler
    returns): with `--interval 3600`, Ctrl-C drained nothing for an hour, and a `docker stop`
    SIGKILLed the autoscaler 10 s after its SIGTERM, its workers undrained."""
    env = {"CONVEYOR_REDIS_URL": redis_url, "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES)}
    process, lines = _autoscaler(env, tmp_path / "scaler", "3600")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        process.send_signal(stop)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()


def _sleeper(marks: Path, siblings: int) -> list[str]:
    """A child that, on SIGTERM, marks it and drains until every sibling got one too (exit 0),
    or gives up after 20 s (exit 3): stopped one after another, the first never sees the rest."""
    code = f"""
import os, pathlib, signal, sys, time
marks = pathlib.Path({str(marks)!r})
def drain(*_):
    (marks / str(os.getpid())).touch()
    deadline = time.monotonic() + 20
    while len(list(marks.iterdir())) < {siblings}:
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
(marks.parent / "ready" / str(os.getpid())).touch()
while True:
    time.sleep(1)
"""
    return [sys.executable, "-c", code]


def test_stopping_workers_signals_them_all_before_waiting(tmp_path: Path) -> None:
    """Ctrl-C stopped one worker at a time: N draining workers took N drains."""
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    marks, ready = tmp_path / "marks", tmp_path / "ready"
    marks.mkdir()
    ready.mkdir()
    names = [f"drainer-{i}" for i in range(3)]
    for name in names:
        stack.spawn(name, _sleeper(marks, len(names)), {})
    until(lambda: len(list(ready.iterdir())) == len(names))
    assert stack.stop_processes(names) == [0, 0, 0]
    assert not stack.processes


def test_stop_timeout_outlasts_the_shutdown_grace(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """A draining worker was killed after 30 s whatever CONVEYOR_SHUTDOWN_GRACE_S allowed it."""
    settings_env(CONVEYOR_SHUTDOWN_GRACE_S="75")
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    assert stack.stop_timeout_s > 75


def test_a_margin_set_short_for_workers_leaves_producers_theirs(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """CONVEYOR_FORCED_EXIT_MARGIN_S, a worker's, bounded every child's stop: set short (as for
    workers that hang), it killed a producer before its streams said goodbye."""
    settings_env(CONVEYOR_SHUTDOWN_GRACE_S="0", CONVEYOR_FORCED_EXIT_MARGIN_S="0.2")
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    ready = tmp_path / "ready"
    code = f"""
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(0)))
pathlib.Path({str(ready)!r}).touch()
while True:
    time.sleep(1)
"""
    stack.spawn("producer-slow", [sys.executable, "-c", code], {})
    until(ready.exists)
    assert stack.stop_processes(["producer-slow"]) == [0]


def _drainer(stack: Stack, folder: Path, name: str) -> subprocess.Popen[bytes]:
    """A DRAINER child of `stack` telling its state in `folder`, once it handles SIGTERM."""
    folder.mkdir()
    process = stack.spawn(name, [sys.executable, "-c", DRAINER, str(folder)], {})
    until(lambda: _state(folder) == "ready")
    return process


def _state(folder: Path) -> str:
    path = folder / "state"
    return path.read_text() if path.exists() else ""


def _reaped(stack: Stack) -> bool:
    """Whether every child the stack stopped without waiting has exited, after one look."""
    stack.reap_stopped()
    return not stack.stopping


def test_a_draining_worker_holds_up_no_other_pool(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """A scale-down waited for its worker's drain (up to CONVEYOR_SHUTDOWN_GRACE_S + 20 s), and
    no other pool was polled meanwhile. Now the tick counts the worker out at once, and the
    next pool's tick runs while it drains on, to be reaped later."""
    stack = Stack.create(tmp_path / "stack", redis_url)
    workers = PoolWorkers(stack)
    partitions = ModelRepository.load(FIXTURES).partitions(["elastic", "tiny"])
    draining, other = pool_scalers(
        partitions, KEYS, workers.start, workers.stop, workers.alive, LEASE_MS
    )
    folder = tmp_path / "drainer"
    process = _drainer(stack, folder, "elastic-default-1")
    draining.workers["elastic-default-1"] = 0.0
    try:
        assert draining.tick(redis_client, now=1e6) == 0  # nothing queued, the cooldown over
        assert other.tick(redis_client, now=1e6) == 0
        assert process.poll() is None and _state(folder) != "exit"  # still draining
        until(lambda: _state(folder) == "term")
        (folder / "release").touch()
        until(lambda: _state(folder) == "exit")
        until(lambda: _reaped(stack))
        assert process.returncode == 0
    finally:
        (folder / "release").touch()
        stack.stop()


def test_ctrl_c_drains_the_workers_stopped_before_too(tmp_path: Path) -> None:
    """Stops no longer wait, so a worker stopped at a poll may still drain at Ctrl-C: the
    shutdown waits for it as for the workers it stops then, and kills neither."""
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    workers = PoolWorkers(stack)
    folders = [tmp_path / "stopped-before", tmp_path / "counted"]
    processes = [_drainer(stack, folder, folder.name) for folder in folders]
    workers.stop(["stopped-before"])
    until(lambda: _state(folders[0]) == "term")
    shutdown = threading.Thread(target=workers.drain, args=(["counted"],))
    shutdown.start()
    until(lambda: _state(folders[1]) == "term")
    shutdown.join(timeout=0.5)
    assert shutdown.is_alive()  # neither can exit before it is released
    for folder in folders:
        (folder / "release").touch()
    shutdown.join(timeout=60)
    assert not shutdown.is_alive() and not stack.stopping
    assert [process.returncode for process in processes] == [0, 0]


# A worker with an engine process of its own (vLLM's engine core, in its process group): it
# writes the engine's pid to argv[1], then sleeps until killed or stopped (SIGTERM's default).
WITH_ENGINE = """
import pathlib, subprocess, sys, time
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pathlib.Path(sys.argv[1]).write_text(str(engine.pid))
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """Whether process `pid` ended (a zombie, its parent gone, waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("end", ["killed", "scaled down"])
def test_a_worker_ended_takes_its_engine_process_with_it(tmp_path: Path, end: str) -> None:
    """A worker killed (kill -9, the OOM killer) was counted out and forgotten, and one scaled
    down forgotten at its exit: the engine-core process an LLM worker starts ran on (3.5 GB
    each for smollm2), one more at every death. Now its process group follows it out."""
    stack = Stack.create(tmp_path / "stack", NO_REDIS)
    workers = PoolWorkers(stack)
    engine_pid = tmp_path / "engine.pid"
    process = stack.spawn("worker", [sys.executable, "-c", WITH_ENGINE, str(engine_pid)], {})
    until(engine_pid.exists)
    engine = int(engine_pid.read_text())
    try:
        if end == "killed":
            process.kill()
            process.wait()
            assert not workers.alive("worker")
        else:
            workers.stop(["worker"])
        until(lambda: _reaped(stack))
        assert _gone(engine)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGKILL)


@pytest.mark.slow
def test_a_scale_up_starts_its_workers_side_by_side(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scale-up by N started N workers in turn, each waited for until its engine had loaded,
    and no pool was polled meanwhile. Now one tick spawns them all, and the polls after look at
    each: one not ready within CONVEYOR_START_TIMEOUT_S is stopped, counted out and reported,
    as a failed start was, and the next poll tries again."""
    stack = Stack.create(tmp_path / "stack", redis_url)
    stack.env.update(CONVEYOR_MODEL_REPOSITORY=str(FIXTURES), PYTHONPATH=str(REPO_ROOT))
    stack.start_timeout_s = 0.0  # no worker is ready by the next poll
    workers = PoolWorkers(stack)
    partitions = ModelRepository.load(FIXTURES).partitions(["elastic"])
    (scaler,) = pool_scalers(partitions, KEYS, workers.start, workers.stop, workers.alive, LEASE_MS)
    _queue(redis_client, 20, KEYS.queue("elastic", "default"))  # two workers' worth
    try:
        assert scaler.tick(redis_client, now=0.0) == 2
        first, second = scaler.workers
        assert set(workers.ready_by) == {first, second}  # both spawned, neither waited for
        assert stack.running(first) and stack.running(second)
        _tick(scaler, redis_client)
        said = capsys.readouterr().err
        assert said.startswith("elastic:default: a worker did not start ("), said
        assert f"{first} was not ready after 0s (CONVEYOR_START_TIMEOUT_S)" in said, said
        assert list(scaler.workers) == [second] and first in stack.stopping
        with pytest.raises(ChildTooSlow):
            scaler.tick(redis_client)
        assert not scaler.workers and not workers.ready_by and not stack.processes
    finally:
        workers.drain(list(scaler.workers))


@pytest.mark.slow
def test_a_repository_broken_mid_run_holds_back_its_starts_not_the_autoscaler(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each worker's start reads the model repository anew: a typo saved in any model's
    config.yaml while the autoscaler ran ended it at its next scale-up, with a traceback, and
    every pool's workers with it. Now that pool's start fails as a worker's would, backs off, and
    the first poll after the fix and the backoff starts it."""
    repository = tmp_path / "models"
    shutil.copytree(FIXTURES, repository)
    stack = Stack.create(tmp_path / "stack", redis_url)
    stack.env.update(CONVEYOR_MODEL_REPOSITORY=str(repository), PYTHONPATH=str(REPO_ROOT))
    workers = PoolWorkers(stack)
    partitions = ModelRepository.load(repository).partitions(["elastic"])
    (scaler,) = pool_scalers(partitions, KEYS, workers.start, workers.stop, workers.alive, LEASE_MS)
    tiny = repository / "tiny" / "config.yaml"
    good = tiny.read_text()
    tiny.write_text(good.replace("max_length: 5", "max_length: -5"))
    _queue(redis_client, 1, KEYS.queue("elastic", "default"))
    try:
        for now in (0.0, 0.2):  # the second poll is within the backoff: no start tried
            _tick(scaler, redis_client, now)
        said = capsys.readouterr()
        assert said.err.count("elastic:default: a worker did not start (") == 1, said.err
        assert "tiny/config.yaml: queue.max_length: " in said.err, said.err
        assert "elastic:default replicas=0 (backing off 0.3s more: " in said.out, said.out
        assert not scaler.workers
        tiny.write_text(good)
        _tick(scaler, redis_client, now=1.0)
        assert len(scaler.workers) == 1
    finally:
        scaler.release(redis_client)
        workers.drain(list(scaler.workers))
        stack.stop()


def _no_cluster_node() -> RedisClusterException:
    """What redis-py raises when no node of a cluster answers: no RedisError."""
    with pytest.raises(RedisClusterException, match="Redis Cluster cannot be connected") as raised:
        redis.RedisCluster.from_url(NO_REDIS)
    return raised.value


def test_a_cluster_outage_keeps_the_pool_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """On a Redis Cluster, a failover that outlasted the client's retries (CLUSTERDOWN, a
    ResponseError) and a cluster no node answered (a RedisClusterException) escaped the poll:
    the autoscaler died, and stopped every worker it had started on its way out."""
    ledger = Ledger()
    outages = [ClusterDownError("CLUSTERDOWN The cluster is down"), _no_cluster_node()]
    scaler = OutageScaler(**vars(_scaler(ledger)), outages=outages)
    scaler.workers["elastic-default-1"] = 0.0
    client = redis.Redis.from_url(NO_REDIS)
    for _ in range(2):
        _tick(scaler, client)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2, said
    assert all(line.startswith("elastic:default: redis unavailable (") for line in said), said
    assert list(scaler.workers) == ["elastic-default-1"] and not ledger.stopped


def test_the_stack_client_times_out_as_configured(
    tmp_path: Path, settings_env: Callable[..., None]
) -> None:
    """A frozen Redis hung a poll for good: the autoscaler's client had no socket timeouts,
    whatever CONVEYOR_REDIS_TIMEOUT_S said."""
    settings_env(CONVEYOR_REDIS_TIMEOUT_S="3.5")
    client = Stack.create(tmp_path / "stack", NO_REDIS).client()
    options = client.connection_pool.connection_kwargs
    assert options["socket_timeout"] == options["socket_connect_timeout"] == 3.5, options
    client.close()


@pytest.fixture(scope="module")
def elastic_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One pipeline for the module's `conveyor autoscale` runs (each start costs seconds)."""
    with running_stack(
        tmp_path_factory.mktemp("elastic"),
        CONVEYOR_MODEL_REPOSITORY=str(FIXTURES),
        PYTHONPATH=str(REPO_ROOT),
        CONVEYOR_AUTH="disabled",
        CONVEYOR_BLOCK_MS="100",  # workers notice a stop within 0.1 s, not 1 s
    ) as stack:
        yield stack


@pytest.fixture
def elastic_stack(elastic_pipeline: Stack) -> Stack:
    """The module's pipeline with the elastic pool's lanes as a new one has them: empty, with
    their group. A test before may have left a backlog behind (its autoscaler stopped, its
    workers drained), which would scale the next test's pool up at its first poll."""
    client = elastic_pipeline.client()
    try:
        for lane in (KEYS.queue("elastic", "default"), KEYS.bulk_queue("elastic", "default")):
            client.delete(lane)
            client.xgroup_create(lane, GROUP, id="0", mkstream=True)
    finally:
        client.close()
    return elastic_pipeline


def _autoscaler(
    env: dict[str, str], state_dir: Path, interval: str
) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """`conveyor autoscale` of the elastic pool, and its output (stderr too), line by line."""
    process = subprocess.Popen(
        [*AUTOSCALE, "--interval", interval, "--state-dir", str(state_dir)],
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, _lines(process)


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(
    lines: queue.Queue[str], wanted: str, timeout: float, prefix: bool = False
) -> list[str]:
    """Lines up to the first that is `wanted` (or, with `prefix`, starts with it)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        seen.append(line)
        if line == wanted or (prefix and line.startswith(wanted)):
            return seen
    raise AssertionError(f"never saw {wanted!r}; last lines: {seen[-5:]}")


async def _burst(base_url: str, count: int, sleep_ms: int = 400) -> list[str]:
    """`count` elastic jobs, each batch of them taking `sleep_ms`."""
    job = {"model": "elastic", "inputs": {"sleep_ms": sleep_ms}}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/v1/jobs", json=job) for _ in range(count)))
    bad = [r for r in responses if r.status_code != 202]
    assert not bad, bad[0].text
    return [r.json()["id"] for r in responses]


@pytest.mark.slow
def test_burst_scales_up_then_idle_scales_to_zero(elastic_stack: Stack, tmp_path: Path) -> None:
    process, lines = _autoscaler(elastic_stack.env, tmp_path / "scaler", "0.5")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        ids = asyncio.run(_burst(elastic_stack.base_url, 200))
        _wait_for(lines, "elastic:default replicas=3", timeout=120)
        client = redis.Redis.from_url(elastic_stack.redis_url, decode_responses=True)
        until(lambda: all(client.hget(KEYS.job(i), "status") == "succeeded" for i in ids), 120)
        workers = {client.hget(KEYS.job(i), "worker") for i in ids}
        assert len(workers) > 1
        after = _wait_for(lines, "elastic:default replicas=0", timeout=120)
        assert "elastic:default replicas=2" in after and "elastic:default replicas=1" in after
        client.close()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def _takers(client: redis.Redis, ids: list[str]) -> set[str]:
    """The workers (consumer names, `{host}-{pid}`) that took any of the jobs `ids`."""
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(KEYS.job(job_id), "worker")
    return set(pipe.execute()) - {None}


@pytest.mark.slow
def test_a_worker_that_dies_is_replaced(elastic_stack: Stack, tmp_path: Path) -> None:
    """Nothing looked at whether a worker it started still ran: one killed (for memory, by a
    crash) went on counting, the formula saw its replicas all there, and the pool stayed short
    for good. Now the next poll says so and starts another, as Kubernetes restarts a pod. The
    backlog is queued, slow, before the autoscaler starts: posted while it polled, a burst that
    a loaded machine posted slower than three workers drained scaled the pool down and up
    meanwhile, and the worker picked to be killed had been stopped already."""
    ((config, variant),) = ModelRepository.load(FIXTURES).partitions(["elastic"])
    hints, pool = config.autoscaling, f"{config.name}:{variant}"
    # 240 jobs in batches of 8 taking 5 s: 50 s of three workers' work, far longer than a start
    ids = asyncio.run(_burst(elastic_stack.base_url, 240, sleep_ms=5000))
    # its workers are mid-batch when it stops: cut off (their jobs stay pending), not drained
    cut = {"CONVEYOR_SHUTDOWN_GRACE_S": "0", "CONVEYOR_FORCED_EXIT_MARGIN_S": "1"}
    process, lines = _autoscaler({**elastic_stack.env, **cut}, tmp_path / "scaler", "0.5")
    client = redis.Redis.from_url(elastic_stack.redis_url, decode_responses=True)
    try:
        _wait_for(lines, f"{pool} replicas={hints.max_replicas}", timeout=120)
        until(lambda: len(_takers(client, ids)) == hints.max_replicas, 120)
        serving = _takers(client, ids)  # its own workers, all it started, all taking jobs
        # entries only leave the stream: at every poll it wanted its max, so it stopped none
        backlog = client.xlen(KEYS.queue(config.name, variant))
        assert backlog > (hints.max_replicas - 1) * hints.lag_per_replica, backlog
        victim = min(serving)
        os.kill(int(victim.rsplit("-", 1)[1]), signal.SIGKILL)
        [*_, noticed] = _wait_for(lines, f"{pool}: worker ", timeout=30, prefix=True)
        assert " ended after " in noticed, noticed
        # a worker it started since serves the backlog (the dead one's jobs are reclaimed after
        # the visibility timeout, as ever)
        until(lambda: _takers(client, ids) - serving, 120)
    finally:
        client.close()
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


@pytest.mark.slow
def test_a_redis_outage_keeps_the_pools_as_they_are(tmp_path: Path) -> None:
    """A poll that found Redis gone raised out of the loop: the autoscaler died, and stopped
    every worker it had started on its way out. Now it says so and polls again. (An
    unreachable Redis at start is one clear error.)"""
    # the refused one starts (seconds of imports) side by side with the stack and the other
    refused = subprocess.Popen(
        [*AUTOSCALE, "--state-dir", str(tmp_path / "refused")],
        env={
            **os.environ,
            "CONVEYOR_REDIS_URL": "redis://127.0.0.1:1/0",
            "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        mine = Stack.create(tmp_path / "stack")
    except BaseException:
        refused.kill()
        refused.communicate()
        raise
    env = {**mine.env, "CONVEYOR_MODEL_REPOSITORY": str(FIXTURES)}
    process, lines = _autoscaler(env, tmp_path / "scaler", "0.2")
    try:
        try:
            _, refused_stderr = refused.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # as subprocess.run's timeout: killed, then raised
            refused.kill()
            refused.communicate()
            raise
        assert refused.returncode == 1 and "Error: cannot reach Redis at" in refused_stderr
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        mine.restart_valkey(down_s=1.0)
        _wait_for(lines, "elastic:default: redis unavailable (", timeout=30, prefix=True)
        _wait_for(lines, "elastic:default replicas=0", timeout=30)  # polling on, after it
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
        mine.stop()


@pytest.mark.slow
def test_a_worker_slower_than_the_start_timeout_is_reported(
    elastic_stack: Stack, tmp_path: Path
) -> None:
    """CONVEYOR_START_TIMEOUT_S bounds a scale-up's start, as `conveyor up`'s: the autoscaler
    waited 300 s whatever was set, and then named the setting it had ignored."""
    env = {**elastic_stack.env, "CONVEYOR_START_TIMEOUT_S": "0.05"}
    process, lines = _autoscaler(env, tmp_path / "scaler", "0.5")
    try:
        _wait_for(lines, "elastic:default replicas=0", timeout=60)
        asyncio.run(_burst(elastic_stack.base_url, 20))
        [*_, failed] = _wait_for(lines, "elastic:default: a worker did not start", 60, True)
        assert "not ready after 0.05s (CONVEYOR_START_TIMEOUT_S)" in failed, failed
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


@pytest.mark.slow
def test_a_worker_that_keeps_dying_at_start_is_restarted_with_growing_delays(
    tmp_path: Path,
    redis_url: str,
    redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that died at every start (a broken model) was replaced at once: the poll that
    saw it dead was followed by one that started the next, every other poll, for good. Now the
    pool backs off as Kubernetes' CrashLoopBackOff does: each start waits twice as long as the
    one before, and the polls between say so and why. Real workers, polled every 0.5 s of the
    scaler's own clock."""
    repository = tmp_path / "models"
    (repository / "broken").mkdir(parents=True)
    (repository / "broken" / "config.yaml").write_text(BROKEN)
    stack = Stack.create(tmp_path / "stack", redis_url)
    stack.env.update(CONVEYOR_MODEL_REPOSITORY=str(repository), PYTHONPATH=str(REPO_ROOT))
    # a worker whose start failed is made to exit this long after (status 70): left to Celery,
    # its exit took 2 s more
    stack.env["CONVEYOR_FORCED_EXIT_MARGIN_S"] = "0.5"
    workers = PoolWorkers(stack)
    partitions = ModelRepository.load(repository).partitions(["broken"])
    (scaler,) = pool_scalers(partitions, KEYS, workers.start, workers.stop, workers.alive, LEASE_MS)
    stream = KEYS.queue("broken", "default")
    _queue(redis_client, 1, stream)  # the pool wants one worker throughout
    starts: list[float] = []
    try:
        for poll in range(20):
            now = poll * 0.5
            for name in scaler.workers:  # it has died by the next poll
                stack.processes[name].wait(timeout=120)
            started = scaler.started
            _tick(scaler, redis_client, now)
            if scaler.started > started:
                starts.append(now)
            stack.reap_stopped()
    finally:
        redis_client.delete(stream)
        scaler.release(redis_client)
        workers.drain(list(scaler.workers))
        stack.stop()
    assert starts == [0.0, 1.0, 2.5, 5.0, 9.5]  # every other poll, it was 0.0, 1.0, 2.0, 3.0 …
    delays = re.findall(r"ended after [\d.]+s; backing off, next start in ([\d.]+)s", caplog.text)
    assert delays == ["0.5", "1.0", "2.0", "4.0"], caplog.text
    said = capsys.readouterr()
    assert said.err.count("broken:default: a worker did not start (") == 4, said.err
    why = "crash loop exit 2: the wait doubles with each exit within 60s of its start, up to 30s"
    assert f"broken:default replicas=0 (backing off 0.5s more: {why})" in said.out, said.out
