"""HTTP load generators bounded in time and in count: closed loop (N clients, each sends its next
request when the last one answers) for throughput at a concurrency, and open loop (Poisson
arrivals at a fixed rate, latency counted from the scheduled send) for latency under a given load
without coordinated omission, its percentiles counting every unanswered request as slower than
every answered one (`percentile_counting_unanswered`).

Requests go over plain keep-alive HTTP/1.1 connections on asyncio streams, not httpx: on two
cores httpx's pool cost 3 ms of client CPU per request at concurrency 1 and 19 ms at 128 (its
pool scans every connection), so it, not the servers, set the measured ceiling."""

from __future__ import annotations

import asyncio
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import orjson
import uvloop

T = TypeVar("T")


def drive(load: Coroutine[Any, Any, T]) -> T:
    """Run a load on uvloop, which keeps the generator's own CPU per request low."""
    return uvloop.run(_interruptible(load))


async def _interruptible(load: Coroutine[Any, Any, T]) -> T:
    """`load`, ended by whatever pytest-timeout's SIGALRM handler raises while it runs. Python
    runs the handler wherever the main thread is: in uvloop's own callback, which only logs
    what it raises (KeyboardInterrupt and SystemExit aside), or in a background task such as
    vLLM's output handler, which then dies unseen. Either way the failure vanished, and a
    stalled load ran on until CI's own limit killed the whole run."""
    main = asyncio.current_task()
    previous = signal.getsignal(signal.SIGALRM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if main is None or not callable(previous) or not in_main_thread:
        return await load
    escaped: list[BaseException] = []

    def alarm(signum: int, frame: FrameType | None) -> None:
        try:
            previous(signum, frame)
        except BaseException as error:
            escaped.append(error)
            main.cancel()
            raise

    signal.signal(signal.SIGALRM, alarm)
    try:
        return await load
    except asyncio.CancelledError:
        if escaped:
            raise escaped[0] from None
        raise
    finally:
        signal.signal(signal.SIGALRM, previous)


@dataclass
class LoadResult:
    """Successful requests' latencies and what their answers said about batching."""

    elapsed_s: float = 0.0
    offered: int = 0
    # Seconds over which the requests were sent (open loop: the arrival schedule).
    sending_s: float = 0.0
    first_done: float = 0.0
    last_done: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    dropped: int = 0
    job_ids: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return len(self.latencies_s)

    @property
    def unanswered(self) -> int:
        """Requests offered but never answered with success: dropped, failed, or cut off at
        the end of an open loop's drain."""
        return self.offered - self.completed

    @property
    def rps(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def offered_rps(self) -> float:
        return self.offered / self.sending_s if self.sending_s > 0 else 0.0

    @property
    def achieved_rps(self) -> float:
        """Answers per second between the first and the last answer: the offered rate while
        the system keeps up (the answers trail the sends by one latency at both ends), its
        capacity once it does not."""
        span = self.last_done - self.first_done
        return (self.completed - 1) / span if self.completed > 1 and span > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        return float(np.percentile(self.latencies_s, q) * 1000.0)

    def percentile_counting_unanswered_ms(self, q: float) -> float:
        """The open loop's honest percentile: see `percentile_counting_unanswered`."""
        return percentile_counting_unanswered(self.latencies_s, self.unanswered, q)

    def summary(self) -> dict[str, float | int]:
        """Unrounded: a target's ratio of two p50s near 1 ms rounded to 0.01 ms moved by ±0.5 %,
        enough to turn a verdict (the report's tables round what they show)."""
        return {
            "completed": self.completed,
            "errors": self.errors,
            "dropped": self.dropped,
            "elapsed_s": round(self.elapsed_s, 3),
            "rps": self.rps,
            "p50_ms": self.percentile_ms(50),
            "p99_ms": self.percentile_ms(99),
        }

    def record(self, ok: bool, payload: bytes, latency_s: float) -> None:
        if not ok:
            self.errors += 1
            return
        self.last_done = time.perf_counter()
        self.first_done = self.first_done or self.last_done
        self.latencies_s.append(latency_s)
        body = orjson.loads(payload)
        if "id" in body:
            self.job_ids.append(str(body["id"]))
        if "batch_size" in body:
            self.batch_sizes.append(int(body["batch_size"]))


def percentile_counting_unanswered(
    latencies_s: Sequence[float], unanswered: int, q: float
) -> float:
    """The q-th percentile in ms (numpy's linear interpolation) of every request sent, those
    never answered counted as slower than every answered one, as wrk2 and vegeta count them:
    leaving them out understated the worst latencies exactly when the system was overloaded.
    Infinite where the unanswered decide it (p99 from about 1 % unanswered): the
    percentile is then only known to exceed the slowest answer. NaN with no request at all."""
    answered = np.sort(np.asarray(latencies_s, dtype=float)) * 1000.0
    total = answered.size + unanswered
    if total == 0:
        return math.nan
    rank = q / 100.0 * (total - 1)
    if math.ceil(rank) >= answered.size:
        return math.inf
    return float(np.interp(rank, np.arange(answered.size), answered))


class Connection:
    """One keep-alive HTTP/1.1 connection: writes a whole request, reads a Content-Length answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status_line.split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class Target:
    """Requests to one server, cycled in order (one body, or one per sentence, or one GET per
    job), with idle connections kept for reuse: at most one per request in flight, so a closed
    loop of N clients holds N connections. `ok` is the status that counts as success."""

    def __init__(self, url: str, requests: list[bytes], ok: int = 200) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.requests = requests
        self.ok = ok
        self.sent = 0
        self.idle: list[Connection] = []

    @classmethod
    def post(cls, url: str, bodies: list[dict[str, Any]], ok: int = 200) -> Target:
        parts = urlsplit(url)
        requests = []
        for body in bodies:
            data = orjson.dumps(body)
            head = (
                f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            )
            requests.append(head.encode() + data)
        return cls(url, requests, ok)

    @classmethod
    def get(cls, base_url: str, paths: list[str]) -> Target:
        host = urlsplit(base_url).netloc
        return cls(base_url, [f"GET {p} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() for p in paths])

    async def send(self, result: LoadResult, start: float) -> None:
        """One request; `start` is when it should have been sent (open loop) or was (closed)."""
        request = self.requests[self.sent % len(self.requests)]
        self.sent += 1
        connection: Connection | None = None
        try:
            connection = self.idle.pop() if self.idle else await self._connect()
            status, payload = await connection.send(request)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            if connection is not None:
                connection.close()
            result.errors += 1
            return
        self.idle.append(connection)
        result.record(status == self.ok, payload, time.perf_counter() - start)

    async def _connect(self) -> Connection:
        return Connection(*await asyncio.open_connection(self.host, self.port))

    async def warm(self, connections: int) -> None:
        """Open idle connections up to `connections` before a timed window, as load tools warm
        theirs: a closed loop's clients otherwise each timed a TCP handshake and the server's
        accept with their first request. One that fails to open is left for a request to retry,
        which then counts the failure."""
        opened = await asyncio.gather(
            *(self._connect() for _ in range(connections - len(self.idle))),
            return_exceptions=True,
        )
        self.idle += [c for c in opened if isinstance(c, Connection)]

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


async def closed_loop(
    target: Target,
    concurrency: int,
    seconds: float,
    max_requests: int,
    warmup_s: float = 0.0,
    measuring: Callable[[], None] | None = None,
) -> LoadResult:
    """`concurrency` clients back to back for `seconds` (after an unmeasured warm-up), their
    connections open before the timed window begins; `measuring` is called as it begins (part
    A starts its CPU meter there, past the warm-up and the connects)."""
    try:
        if warmup_s > 0:
            await _closed_clients(target, concurrency, warmup_s, max_requests)
        await target.warm(concurrency)
        if measuring is not None:
            measuring()
        return await _closed_clients(target, concurrency, seconds, max_requests)
    finally:
        target.close()


def closed_loop_run(
    target: Target, concurrency: int, seconds: float, max_requests: int
) -> dict[str, Any]:
    """One generator process's closed loop as plain data, for a pool process to send back: its
    latencies, errors and wall time, and the CPU it spent generating."""
    began = time.process_time()
    result = drive(closed_loop(target, concurrency, seconds, max_requests))
    return {
        "latencies_s": result.latencies_s,
        "errors": result.errors,
        "elapsed_s": result.elapsed_s,
        "cpu_s": time.process_time() - began,
    }


@dataclass
class MergedRuns:
    """Several generator processes' `closed_loop_run`s taken as one load."""

    latencies_ms: np.ndarray
    errors: int
    jobs_per_s: float  # each process's own rate, summed
    wall_s: float  # the longest process's
    cpu_s: float  # the generator processes' own CPU, summed: what they took from the pipeline

    @classmethod
    def of(cls, runs: list[dict[str, Any]]) -> MergedRuns:
        return cls(
            np.array([s for run in runs for s in run["latencies_s"]]) * 1000.0,
            sum(run["errors"] for run in runs),
            sum(len(run["latencies_s"]) / run["elapsed_s"] for run in runs),
            max(run["elapsed_s"] for run in runs),
            sum(run["cpu_s"] for run in runs),
        )

    @property
    def jobs(self) -> int:
        return len(self.latencies_ms)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.jobs else float("nan")


async def _closed_clients(
    target: Target, concurrency: int, seconds: float, max_requests: int
) -> LoadResult:
    result = LoadResult()
    begin = time.perf_counter()
    deadline = begin + seconds

    async def one_client() -> None:
        while time.perf_counter() < deadline and result.offered < max_requests:
            result.offered += 1
            await target.send(result, time.perf_counter())

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - begin
    return result


def poisson_arrivals(
    rate: float, seconds: float, max_requests: int, min_requests: int = 0, seed: int = 0
) -> Iterator[float]:
    """Seconds from the start of an open loop at which it sends: Poisson arrivals at `rate`/s
    for `seconds`, and on past them until `min_requests` were sent (a low rate's window is
    lengthened, its rate kept), never more than `max_requests`. Seeded: the same schedule for
    every run at a rate."""
    rng = random.Random(seed)
    offset, sent = 0.0, 0
    while sent < max_requests and (offset < seconds or sent < min_requests):
        offset += rng.expovariate(rate)
        sent += 1
        yield offset


async def open_loop(
    target: Target,
    arrivals: Iterable[float],
    max_in_flight: int = 512,
    drain_s: float = 30.0,
) -> LoadResult:
    """A request at each of `arrivals` (seconds from the start: `poisson_arrivals`); one
    finding `max_in_flight` requests outstanding is dropped (counted). See `achieved_rps` for
    what the system sustained."""
    result = LoadResult()
    tasks: set[asyncio.Task[None]] = set()
    begin = time.perf_counter()
    try:
        for offset in arrivals:
            scheduled = begin + offset
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            result.offered += 1
            if len(tasks) >= max_in_flight:
                result.dropped += 1
                continue
            task = asyncio.create_task(target.send(result, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        result.sending_s = time.perf_counter() - begin
        if tasks:
            _, late = await asyncio.wait(set(tasks), timeout=drain_s)
            for task in late:
                task.cancel()
            result.errors += len(late)
        result.elapsed_s = time.perf_counter() - begin
    finally:
        target.close()
    return result
