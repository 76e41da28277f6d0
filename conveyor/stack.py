"""Starts and stops the pipeline's processes on one machine (`conveyor up`, the tests and the
benchmarks share it): an embedded Valkey unless a Redis URL is given, the producer, workers."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

import httpx
import redis
from prometheus_client import multiprocess

from shared.keys import GROUP, Keys
from shared.metrics import MULTIPROC_DIR
from shared.model_repository import ModelRepository
from shared.redis_client import blocking_client, blocking_cluster
from shared.settings import Settings

BIN = Path(sys.executable).parent
# prctl(2), resolved before any child forks; PR_SET_PDEATHSIG from <linux/prctl.h>
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1
PROC = Path("/proc")  # Linux's: the state and the process group of each process
EPHEMERAL_PORTS = PROC / "sys/net/ipv4/ip_local_port_range"  # the kernel's, for outgoing ports
LOWEST_PICKED_PORT = 10_000  # free_port's band starts here (well-known services sit lower)
PORT_TRIES = 200  # ports of the band free_port tries before the kernel's pick
# What a stopped producer or Valkey gets past the grace at least (the margin every child had
# before CONVEYOR_FORCED_EXIT_MARGIN_S, a worker's, could be set).
CHILD_MARGIN_S = 20.0
READY_POLL_S = 0.2  # how often a starting child is looked at
TAIL_BYTES = 1 << 20  # how much of a child's log end `Stack.log_tail` reads at most
# A child's log past this moves to `<name>.log.1` (as Docker's json-file max-size, max-file 2):
# appended across runs and restarts, a worker's line per micro-batch (250 B, 36 more per job)
# grew it by hundreds of MB a day under steady load, without bound.
LOG_CAP_BYTES = 100 << 20
Server = Literal["uvicorn", "conveyor"]
# A producer's command line but its address: uvicorn's own, or the server `conveyor up`,
# compose, Kubernetes and the image run (conveyor/producer_server.py: several per port when
# asked to share it, request heads bounded).
_SERVERS: dict[Server, tuple[str, ...]] = {
    "uvicorn": (
        str(BIN / "uvicorn"),
        "producer_api.app:app",
        "--no-access-log",
        "--no-server-header",
    ),
    "conveyor": (sys.executable, "-m", "conveyor.producer_server"),
}


def reachable(host: str) -> str:
    """Where a client on this machine reaches a server bound to `host`: a wildcard address is
    reached on loopback, an IPv6 literal in brackets."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _port_band() -> range:
    """Where `free_port` picks: below the kernel's ephemeral range, where no outgoing connection's
    port lands between the pick and the child's bind; under pytest-xdist, the worker's own share
    of it, so that two workers never pick the same port. Empty where the range is unknown."""
    try:
        low = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    width = (low - LOWEST_PICKED_PORT) // max(workers, 1)
    share = int(worker) % workers if worker.isdigit() and workers > 0 else 0
    start = LOWEST_PICKED_PORT + share * width
    return range(start, start + width)


def _ports() -> Iterator[int]:
    """The band's ports in turn, from a random one: a process picks no port again before it has
    gone round the band, where the kernel's random pick (bind to port 0) could hand back one it
    had just given for a child still starting."""
    band = _port_band()
    if not band:
        return
    first = random.randrange(len(band))
    yield from itertools.cycle([*band[first:], *band[:first]])


_PORTS, _PORTS_LOCK = _ports(), threading.Lock()  # a generator runs in one thread at a time


def free_port() -> int:
    """A port nothing on this machine listens on now, for a child to bind."""
    for _ in range(PORT_TRIES):
        with _PORTS_LOCK:
            port = next(_PORTS, None)
        if port is None:
            break
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


class ChildNotReady(RuntimeError):
    """A child that did not get ready while starting, told by its own last lines (a host it
    cannot bind, a Redis it cannot reach, an engine that cannot load), not by a traceback of the
    process that waited for it. Long lines keep both ends: a child's last one is often its whole
    traceback as one JSON record, whose exception, the line that says why, is at its end."""

    HEAD_CHARS, TAIL_CHARS = 100, 200

    def __init__(self, name: str, why: str, log: Path, tail: list[str]) -> None:
        cut = [
            line
            if len(line) <= self.HEAD_CHARS + self.TAIL_CHARS
            else f"{line[: self.HEAD_CHARS]} … {line[-self.TAIL_CHARS :]}"
            for line in tail
        ]
        lines = "\n".join(f"  {line}" for line in cut)
        super().__init__(f"{name} {why}; the end of {log}:\n{lines}")


class ChildExited(ChildNotReady):
    """It died while starting."""


class ChildTooSlow(ChildNotReady):
    """It was still starting when `Stack.start_timeout_s` ran out."""


class PortTaken(RuntimeError):
    """Another server answers on the port a producer was started on: one that bound it after
    `conveyor up` looked (another `up` started at the same time on another state dir), sharing
    it with SO_REUSEPORT as `up`'s own producers do when there are several, or answering before
    a lone producer, which cannot bind beside it, has exited."""


@dataclass
class Stopping:
    """A child `terminate` signalled, killed with its group if they still run at `deadline`
    (monotonic); `exited` once its own exit was seen and what it left in its group signalled."""

    process: subprocess.Popen[bytes]
    deadline: float
    exited: bool = False


@dataclass
class Stack:
    """A running pipeline; `stop()` sends SIGTERM so workers drain, then kills stragglers."""

    settings: Settings
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    valkey_command: list[str] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    readiness: dict[str, Callable[[], bool]] = field(default_factory=dict)  # spawned workers
    # children `terminate` signalled (`Stopping`), until they and their groups are gone
    stopping: dict[str, Stopping] = field(default_factory=dict)
    # children seen to exit (`exited`), each with when what it left in its group is killed
    leftovers: dict[str, float] = field(default_factory=dict)
    # exited children whose group was seen gone: never signalled again, since their pid may
    # lead another group by now (pids are reused once no process holds them)
    ended: set[subprocess.Popen[bytes]] = field(default_factory=set)
    start_timeout_s: float = 300.0  # how long a child may take to be ready
    log_cap_bytes: int = LOG_CAP_BYTES  # each child's log and its one rotated file at most

    @classmethod
    def create(
        cls,
        log_dir: Path,
        redis_url: str | None = None,
        valkey_config: dict[str, str] | None = None,
        cluster: bool = False,
    ) -> Stack:
        """Use `redis_url` (any node of a Redis Cluster when `cluster`), or start an embedded
        Valkey (in its own session) when it is None."""
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        settings = (  # with no URL, start_valkey replaces it with the embedded server's
            Settings(redis_cluster=cluster)
            if redis_url is None
            else Settings(redis_url=redis_url, redis_cluster=cluster)
        )
        # CONVEYOR_START_TIMEOUT_S from the start: the embedded Valkey's wait is the first
        stack = cls(settings, log_dir, env, start_timeout_s=settings.start_timeout_s)
        if redis_url is None:
            try:
                stack.start_valkey(valkey_config or {})
            except BaseException:  # Ctrl-C while it starts: no one else holds the stack to stop
                stack.stop()
                raise
        stack.env["CONVEYOR_REDIS_URL"] = stack.redis_url
        stack.env["CONVEYOR_REDIS_CLUSTER"] = "1" if cluster else "0"
        return stack

    def client(self) -> redis.Redis:
        """A blocking client of the stack's Redis (a cluster client on a cluster), whose commands
        fail after CONVEYOR_REDIS_TIMEOUT_S on a frozen server rather than hang, and are sent
        again through a dropped connection (a blip failed `up`'s readiness looks and an
        autoscaler's poll). Each is safe to run twice: reads (PING, XINFO, XLEN, XPENDING, HGET,
        HGETALL, INFO) and the pool leases' scripts, which their owner's token makes idempotent
        (shared/leader_lock.py)."""
        timeout = self.settings.redis_timeout_s
        options = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if self.settings.redis_cluster:
            seeds = self.settings.redis_cluster_nodes
            return cast(redis.Redis, blocking_cluster(self.redis_url, seeds, **options))
        return blocking_client(self.redis_url, **options)

    def start_valkey(self, config: dict[str, str]) -> None:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "conveyor.embedded_valkey",
            "--port",
            str(port),
            "--data-dir",
            str(self.log_dir / "valkey"),
            *(f"--set={key}={value}" for key, value in config.items()),
        ]
        self.valkey_command = command
        self.settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0")
        self.spawn_valkey()

    def restart_valkey(self, down_s: float = 0.0) -> None:
        """Stop the embedded server (it flushes its AOF), stay down `down_s`, start it again on
        the same port and data."""
        self.stop_process("valkey")
        time.sleep(down_s)
        self.spawn_valkey()

    def spawn_valkey(self) -> None:
        """Start the embedded server (again: same port and data) and wait until it answers."""
        self.spawn("valkey", self.valkey_command, {})
        self._wait(self._pings, "valkey")

    base_url: str = ""

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url

    def consumer_name(self, pid: int) -> str:
        """The consumer-group name a worker process reads under (`{host}-{pid}`)."""
        return f"{socket.gethostname()}-{pid}"

    def start_producer(
        self, port: int, name: str = "producer", server: Server = "conveyor", **env: str
    ) -> str:
        """Start a producer and return its URL once it is ready and answers as itself (its
        instance id), not as some other server that already had the port. The deployments'
        server by default, so that what a test exercises is what ships."""
        instance = env.get("CONVEYOR_INSTANCE_ID", name)
        self.start_producer_process(port, name, server, **env)
        base_url = f"http://127.0.0.1:{port}"
        self._wait(lambda: _ready(base_url), name)
        answering = _instance(base_url)
        if answering != instance:
            raise PortTaken(
                f"{base_url} answers as producer {answering!r}, not {instance!r}: "
                "another server has the port"
            )
        self.base_url = self.base_url or base_url
        return base_url

    def start_producers(
        self, port: int, count: int, instance: str, host: str = "127.0.0.1", **env: str
    ) -> str:
        """Start `count` producer processes on `host:port`, sharing it when several
        (`--share-port`, `conveyor/producer_server.py`; a restart runs the same command, so a
        replacement binds beside the live ones), named `producer` when alone else
        `producer-<i>`, with instance ids `<instance>` or `<instance>-<i>`; returns the URL once
        every one of them has answered there, and no other server has."""
        numbers = [""] if count == 1 else [f"-{i}" for i in range(1, count + 1)]
        ids = {f"{instance}{number}" for number in numbers}
        command = [*_SERVERS["conveyor"], "--host", host, "--port", str(port)]
        if count > 1:
            env = {**env, MULTIPROC_DIR: str(self._fresh_metrics_dir())}
            command.append("--share-port")
        processes = {
            f"producer{n}": self.spawn(
                f"producer{n}", command, {**env, "CONVEYOR_INSTANCE_ID": f"{instance}{n}"}
            )
            for n in numbers
        }
        base_url = f"http://{reachable(host)}:{port}"
        seen: set[str] = set()

        def all_answered() -> bool:
            for name, process in processes.items():
                if process.poll() is not None:
                    raise self._exited(name)
            if not _ready(base_url):
                return False
            seen.add(_instance(base_url))
            if not seen <= ids:
                raise PortTaken(
                    f"{base_url} answers as producer {sorted(seen - ids)}, not one of "
                    f"{sorted(ids)}: another server has the port"
                )
            return seen == ids

        self._wait(all_answered, next(iter(processes)))  # it watches them all
        self.base_url = self.base_url or base_url
        return base_url

    def _fresh_metrics_dir(self) -> Path:
        """Where producer processes sharing a port keep their metrics (shared/metrics.py),
        emptied first: files a past run left would count again."""
        path = self.log_dir / "producer-metrics"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def start_producer_process(
        self, port: int, name: str = "producer", server: Server = "conveyor", **env: str
    ) -> subprocess.Popen[bytes]:
        """Spawn a producer on `port` without waiting for it (it may never be ready): under
        the deployments' own server (conveyor/producer_server.py), or uvicorn's command line
        for a test that compares the two."""
        command = [
            *_SERVERS[server],
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        return self.spawn(name, command, {"CONVEYOR_INSTANCE_ID": name, **env})

    def start_worker(self, models: str, name: str | None = None, **env: str) -> int:
        """Start a Celery worker serving `models` (`model` or `model:variant`, comma-separated);
        returns its pid once every partition has a reading consumer."""
        return self.wait_ready(self.spawn_worker(models, name, **env))[0]

    def spawn_worker(self, models: str, name: str | None = None, **env: str) -> str:
        """Start a worker as `start_worker` does without waiting for it; returns its name for
        `wait_ready`. Workers spawned together load their engines side by side: one engine's
        start is mostly one process importing, which leaves the other cores idle."""
        name = name or models.replace(":", "-").replace(",", "_")
        command = [
            str(BIN / "celery"),
            "-A",
            "workers.app",
            "worker",
            "--loglevel=INFO",  # ignored: CONVEYOR_LOG_LEVEL rules (test_observability.py)
            f"--hostname={name}@%h",
            "--without-mingle",
            "--without-gossip",
        ]
        self.metrics_ports[name] = int(env.get("CONVEYOR_METRICS_PORT", free_port()))
        worker_env = {"CONVEYOR_METRICS_PORT": str(self.metrics_ports[name]), **env}
        process = self.spawn(name, command, {"CONVEYOR_MODELS": models, **worker_env})
        streams = self._streams(models, env)
        consumer = self.consumer_name(process.pid)
        self.readiness[name] = lambda: self._consuming(consumer, streams)
        return name

    def metrics_url(self, worker: str, producer_url: str) -> str:
        """Worker `worker`'s `/metrics` on the producer's host (every worker listens on all
        addresses, each on the port it was first started with)."""
        host = producer_url.rpartition(":")[0]
        return f"{host}:{self.metrics_ports[worker]}/metrics"

    def wait_ready(self, *names: str, every_s: float = READY_POLL_S) -> list[int]:
        """The pids of the spawned workers `names`, once each has a reading consumer on every
        one of its partitions (ChildNotReady for the first that dies or runs out of time),
        looked for every `every_s`."""
        for name in names:
            self._wait(self.readiness.pop(name), name, every_s)
        return [self.processes[name].pid for name in names]

    def poll_ready(self, name: str, deadline: float) -> bool:
        """`wait_ready` of one spawned worker without the wait, for a caller that looks again
        later (`conveyor autoscale` polls every pool meanwhile): whether it is ready, after which
        it is not looked at again; ChildExited if it died, ChildTooSlow once `deadline`
        (monotonic) passed."""
        ready = self._look(self.readiness[name], name, deadline)
        if ready:
            del self.readiness[name]
        return ready

    @property
    def stop_timeout_s(self) -> float:
        """How long a stopped worker may take to exit before it is killed: its drain
        (CONVEYOR_SHUTDOWN_GRACE_S, from the settings its children inherit), then an engine's
        close that overran its share and Celery's own exit (CONVEYOR_FORCED_EXIT_MARGIN_S, when
        the worker forces its own exit). A fixed 30 s killed workers that were allowed longer."""
        return self.settings.shutdown_grace_s + self.settings.forced_exit_margin_s

    def stop_timeout_of(self, name: str) -> float:
        """How long child `name` may take to exit once stopped before it is killed: a worker
        its `stop_timeout_s`; a producer its graceful shutdown (CONVEYOR_PRODUCER_SHUTDOWN_GRACE_S:
        given the workers' grace, 0 allowed, it was killed while still in it) and Valkey the
        workers' grace, each with CHILD_MARGIN_S at least: a margin shortened for workers that
        hang (the tests') killed producers before their streams said goodbye, and Valkey before
        it had written its data."""
        if self._tier(name) == 0:
            return self.stop_timeout_s
        margin = max(self.settings.forced_exit_margin_s, CHILD_MARGIN_S)
        if self.producer(name):
            return self.settings.producer_shutdown_grace_s + margin
        return self.settings.shutdown_grace_s + margin

    def stop_process(
        self, name: str, sig: int = signal.SIGTERM, timeout: float | None = None
    ) -> int:
        """Signal child `name` and wait for its exit code (`timeout`: its `stop_timeout_of`)."""
        return self.stop_processes([name], sig, timeout)[0]

    def stop_processes(
        self, names: Iterable[str], sig: int = signal.SIGTERM, timeout: float | None = None
    ) -> list[int]:
        """Signal every child first, then wait for each: they drain side by side (one after
        another, N workers took N drains). Any still running `timeout` after the signal is
        killed (by default each child's `stop_timeout_of`), and so is what a child left in its
        group (`_reap`). Exit codes in the order of `names`. Interrupted (a second Ctrl-C, a
        SIGTERM), it kills them all before it raises: in sessions of their own, they would run
        on."""
        named = list(names)
        timeouts = [self.stop_timeout_of(name) if timeout is None else timeout for name in named]
        processes = [self.processes.pop(name) for name in named]
        try:
            for process in processes:
                _signal(process, sig, self.ended)
            signalled = time.monotonic()
            return [
                _reap(process, signalled + limit, self.ended)
                for process, limit in zip(processes, timeouts, strict=True)
            ]
        except BaseException:
            _kill_all(processes, self.ended)
            raise

    def terminate(self, names: Iterable[str]) -> None:
        """`stop_processes` without the wait, for a caller that cannot block on a drain: each
        child gets SIGTERM (one that exited already: what it left in its group, `_signal`) and
        moves from `processes` (so it is not `running`, and neither a supervisor nor `stop`
        sees it again) to `stopping`, where `reap_stopped` forgets it once it and its group
        are gone, and kills them if they still run `stop_timeout_s` after the signal."""
        deadline = time.monotonic() + self.stop_timeout_s
        for name in names:
            process = self.processes.pop(name)
            self.readiness.pop(name, None)  # one stopped while starting is not waited for
            # Its exit seen before the signal, which then goes to its group: looked at after,
            # one that died of the signal at once was taken for one whose group had it, and
            # its engine ran on until the deadline.
            exited = process.poll() is not None
            _signal(process, signal.SIGTERM, self.ended)
            self.stopping[name] = Stopping(process, deadline, exited)

    def reap_stopped(self) -> None:
        """One look at the children `terminate` signalled, never waiting: one past its deadline
        is killed, group and all; one that exited is forgotten once its group is gone, what it
        left there getting SIGTERM as its exit is seen. (Forgotten at its exit, a worker killed
        or forced to exit left its vLLM engine-core process, gigabytes, running for good.)"""
        now = time.monotonic()
        for name, stopping in list(self.stopping.items()):
            process = stopping.process
            if process.poll() is None:
                if now < stopping.deadline:
                    continue
                _kill_all([process])
            elif not stopping.exited:
                stopping.exited = True
                _signal(process, signal.SIGTERM, self.ended)
                continue
            elif not _group_ended(process.pid, stopping.deadline):
                continue
            self.ended.add(process)
            del self.stopping[name]

    def stop(self) -> None:
        """Stop tier by tier, each tier's children side by side (`stop_processes`): workers
        drain before the producers go, Redis goes last. Stopped one at a time, Ctrl-C took the
        sum of the drains, while the workers not yet signalled kept taking work. Interrupted,
        it kills every child it had not reached yet too."""
        try:
            for tier in range(3):
                named = [
                    name for name in reversed(list(self.processes)) if self._tier(name) == tier
                ]
                self.stop_processes(named)
        except BaseException:
            _kill_all([self.processes.pop(name) for name in list(self.processes)], self.ended)
            raise

    def _tier(self, name: str) -> int:
        """When `stop` stops child `name`: 0 a worker (`spawn_worker`), 1 a producer or any
        other child, 2 the embedded Valkey they all use."""
        if name == "valkey":
            return 2
        return 0 if name in self.metrics_ports else 1

    def producer(self, name: str) -> bool:
        """Whether child `name` runs a producer (under either server of `_SERVERS`)."""
        command = self.commands[name][0]
        return any(command[: len(server)] == list(server) for server in _SERVERS.values())

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start `name` again as it was first started (same command, environment and log)."""
        return self.spawn(name, *self.commands[name])

    def running(self, name: str) -> bool:
        """Whether child `name` was started and has not exited."""
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def exited(self, name: str) -> None:
        """Child `name` was seen to exit: what it left running in its group gets SIGTERM (the
        Valkey wrapper's server, the wrapper killed: it kept the port and the data, and each
        restart failed on the port), and `lingering` says until they are gone. A producer
        sharing its metrics directory takes its per-process series (shared/metrics.py) with
        it, restarted or given up on; its counts stay in the sums."""
        pid = self.processes[name].pid
        if metrics_dir := self.commands[name][1].get(MULTIPROC_DIR):
            multiprocess.mark_process_dead(pid, metrics_dir)
        _signal_group(pid, signal.SIGTERM)
        self.leftovers[name] = time.monotonic() + self.stop_timeout_of(name)

    def lingering(self, name: str) -> bool:
        """Whether what child `name` left in its group when it exited (`exited`) still runs:
        it is not started again before they are gone. One look, never waiting; they are killed
        once its stop timeout has passed since `exited` signalled them."""
        kill_at = self.leftovers.get(name)
        if kill_at is None:
            return False
        process = self.processes[name]
        if not _group_ended(process.pid, kill_at):
            return True
        del self.leftovers[name]
        self.ended.add(process)
        return False

    def log_path(self, name: str) -> Path:
        """Where child `name` writes its output."""
        return self.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 20) -> list[str]:
        """The last `lines` lines `name` wrote, from the log's last `TAIL_BYTES`: a log is
        appended across runs and restarts (up to `log_cap_bytes`, 100 MiB), and read whole
        (gigabytes after weeks up, before the cap) for a crash loop's report it took `conveyor
        up` out of memory."""
        try:
            with self.log_path(name).open("rb") as log:
                start = max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES)
                log.seek(start)
                tail = log.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        if start and len(tail) > 1:  # the window's first line is cut: shown only if alone
            tail = tail[1:]
        return tail[-lines:]

    def cap_logs(self) -> None:
        """Rotate each child's log past `log_cap_bytes`: copied to `<name>.log.1` (the one
        before dropped), then emptied in place, since the child holds it open; opened to append,
        it writes on at the start. A line written between the copy and the cut is lost (as with
        logrotate's copytruncate). One that cannot be rotated (a full disk) is left as it is."""
        for name in self.processes:
            log = self.log_path(name)
            try:
                if log.stat().st_size > self.log_cap_bytes:
                    shutil.copyfile(log, log.with_name(f"{log.name}.1"))
                    os.truncate(log, 0)
            except OSError:
                continue

    def spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start a child named `name`, its output appended to `<log_dir>/<name>.log`; it stops
        (SIGTERM) when this process dies, however it dies (`_exit_with_parent`)."""
        self.commands[name] = (command, env)
        log = self.log_path(name).open("ab")
        # A session of its own: a terminal's Ctrl-C reaches only `conveyor up`, which then
        # stops the children in order (workers drain on SIGTERM).
        process = subprocess.Popen(
            command,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_exit_with_parent(),
        )
        self.processes[name] = process
        return process

    def _streams(self, models: str, env: dict[str, str]) -> list[str]:
        env = {**self.env, **env}
        root = Path(env.get("CONVEYOR_MODEL_REPOSITORY", str(self.settings.model_repository)))
        keys = Keys(env.get("CONVEYOR_KEY_PREFIX", self.settings.key_prefix))
        partitions = ModelRepository.load(root).partitions(models.split(","))
        return [keys.queue(config.name, variant) for config, variant in partitions]

    def _pings(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError):  # not up yet, or not answering yet
            return False
        finally:
            client.close()

    def _consuming(self, consumer: str, streams: list[str]) -> bool:
        client = self.client()
        try:
            for stream in streams:
                names = {c["name"] for c in client.xinfo_consumers(stream, GROUP)}
                if consumer.encode() not in names:
                    return False
            return True
        except redis.ResponseError:
            return False
        finally:
            client.close()

    def _wait(self, check: Callable[[], bool], child: str, every_s: float = READY_POLL_S) -> None:
        """Until `check` passes, looked at every `every_s`; ChildExited as soon as the child
        named `child` dies instead, ChildTooSlow when `start_timeout_s` runs out."""
        deadline = time.monotonic() + self.start_timeout_s
        while not self._look(check, child, deadline):
            time.sleep(every_s)

    def _look(self, check: Callable[[], bool], child: str, deadline: float) -> bool:
        """One look of `_wait`'s: whether `check` passes; ChildExited if `child` died,
        ChildTooSlow once `deadline` (monotonic) passed."""
        if check():
            return True
        if not self.running(child):
            raise self._exited(child)
        if time.monotonic() >= deadline:
            why = f"was not ready after {self.start_timeout_s:g}s (CONVEYOR_START_TIMEOUT_S)"
            raise ChildTooSlow(child, why, self.log_path(child), self.log_tail(child))
        return False

    def _exited(self, name: str) -> ChildExited:
        why = "exited before it was ready"
        return ChildExited(name, why, self.log_path(name), self.log_tail(name))


def _exit_with_parent() -> Callable[[], None] | None:
    """For a child about to start: on Linux, the kernel sends it SIGTERM (its orderly stop)
    once this process dies, even by SIGKILL or the OOM killer, which leave no time to stop it;
    in a session of its own, it ran on, holding the port and the Valkey data. The signal
    follows the thread that started the child, not the process: only the main thread's
    children get it (one started from a thread that ends would be stopped with it). None
    elsewhere: nothing to set."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl, parent = _PRCTL, os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # it died before prctl: no signal is coming
            os._exit(1)

    return die_with_parent


def _signal(
    process: subprocess.Popen[bytes], sig: int, ended: Collection[subprocess.Popen[bytes]]
) -> None:
    """A stop's signal: to the child while it runs (its group's other processes, an LLM
    worker's engine, serve its drain), else to what it left in its group (the Valkey wrapper's
    server, the wrapper killed: it outlived `conveyor up`, and the next one started a second
    server on the same data), unless that group was seen gone (`ended`)."""
    if process.poll() is None:
        process.send_signal(sig)
    elif process not in ended:
        _signal_group(process.pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    """`sig` to every process of group `pgid` (a child's: each leads its own, `Stack.spawn`);
    none there, or another user's (its pid reused), is nothing to signal."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_ended(pgid: int, kill_at: float) -> bool:
    """One look: whether process group `pgid` is gone, zombies aside: they hold no port and no
    file, and an orphan's waits for an init to reap it (a container's PID 1 looks every few
    seconds, or never: counted on, a stop waited for it until `kill_at`). Past `kill_at`
    (monotonic) it is killed and counted gone."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    if not _group_runs(pgid):
        return True
    if time.monotonic() < kill_at:
        return False
    _signal_group(pgid, signal.SIGKILL)
    return True


def _group_runs(pgid: int) -> bool:
    """Whether a process of group `pgid` has yet to exit, by /proc's states (a zombie's `Z`, a
    dead one's `X`). Where /proc shows none of it (not Linux, another namespace's), any process
    of it is taken to run."""
    try:
        pids = [entry for entry in os.listdir(PROC) if entry.isdigit()]
    except OSError:
        return True
    states = [state for pid in pids if (state := _state_in(pid, pgid))]
    return not states or any(state not in ("Z", "X") for state in states)


def _state_in(pid: str, pgid: int) -> str:
    """Process `pid`'s state (/proc/<pid>/stat's field 3) if it is in group `pgid` (field 5),
    else empty; empty too once it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return ""
    # field 2, the command's name in parentheses, may hold spaces and `)`: fields 3 on follow
    # its last `)`
    state, _ppid, group, *_ = stat.rsplit(")", 1)[1].split()
    return state if int(group) == pgid else ""


def _reap(
    process: subprocess.Popen[bytes], deadline: float, ended: Collection[subprocess.Popen[bytes]]
) -> int:
    """Its exit code, killing it if it is still running at `deadline` (monotonic); then what it
    left in its group gets SIGTERM, and is killed if still there at `deadline` (unless the
    group was seen gone before, `ended`)."""
    try:
        code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_all([process])
        return process.wait()
    if process in ended:
        return code
    _signal_group(process.pid, signal.SIGTERM)
    while not _group_ended(process.pid, deadline):
        time.sleep(0.05)
    return code


def _kill_all(
    processes: list[subprocess.Popen[bytes]], ended: Collection[subprocess.Popen[bytes]] = ()
) -> None:
    """SIGKILL each child's whole process group (each leads its own, `Stack.spawn`), one that
    exited too unless its group was seen gone (`ended`), then reap them: the Valkey wrapper's
    server is a process of its own in its group, which a kill of the wrapper alone left running
    on the data directory. Ctrl-C, SIGTERM and SIGHUP wait until done."""
    with _signals_held():
        running = [process for process in processes if process.poll() is None]
        for process in processes:
            if process not in ended:
                _signal_group(process.pid, signal.SIGKILL)
        for process in running:
            process.wait()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait (blocked, then delivered) until the block is done."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _instance(base_url: str) -> str:
    """The instance id of the producer answering at `base_url`."""
    answer: str = httpx.get(f"{base_url}/healthz", timeout=5.0).json().get("instance", "")
    return answer


def _ready(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
