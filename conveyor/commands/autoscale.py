"""`conveyor autoscale`: run worker processes for the given pools and scale them from queue
depth with KEDA's formula, until Ctrl-C (which drains them)."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

from conveyor.finite_float import FiniteFloat
from conveyor.state_dir_lock import state_dir_lock
from shared.limits import YEAR_S

# Redis, the stack and the model repository are imported in the functions that use them:
# `conveyor autoscale --help` and a usage error need none of them.
if TYPE_CHECKING:
    import redis

    from autoscaling.local_autoscaler import PoolScaler
    from conveyor.stack import Stack


@click.command("autoscale")
@click.option("--models", required=True, help="Pools: `model` (all variants) or `model:variant`.")
@click.option(
    "--interval",
    default=None,
    # a model's polling_interval_s bound: past it, the wait overflowed time_t (a traceback
    # after the first poll, the workers drained) and the lease's milliseconds int64
    type=FiniteFloat(min=0, min_open=True, max=YEAR_S),
    help="Seconds between polls (default: the models' polling_interval_s).",
)
@click.option(
    "--state-dir", default=Path("var/autoscale"), type=click.Path(path_type=Path), help="Logs."
)
def command(models: str, interval: float | None, state_dir: Path) -> None:
    """Scale workers between each model's min and max replicas, as KEDA would."""
    with state_dir_lock(state_dir, "conveyor autoscale", "--state-dir"):
        _autoscale(models, interval, state_dir)


def _autoscale(models: str, interval: float | None, state_dir: Path) -> None:
    """The polls; each pool scaled only while this process holds its lease (`PoolScaler`)."""
    from autoscaling.local_autoscaler import lease_ms_for, pool_scalers
    from conveyor.configured_repository import configured_repository
    from conveyor.local_stack import NO_STACK, refuse_unreachable, stack_redis
    from conveyor.stack import Stack
    from shared.keys import Keys
    from shared.settings import get_settings

    settings = stack_redis(get_settings())
    partitions = configured_repository(settings).partitions(models.split(","))
    stack = Stack.create(state_dir, settings.redis_url, cluster=settings.redis_cluster)
    keys = Keys(settings.key_prefix)
    workers = PoolWorkers(stack)
    period = interval or min(c.autoscaling.polling_interval_s for c, _ in partitions)
    refuse_unreachable(stack.redis_url, NO_STACK)
    client = stack.client()
    scalers = pool_scalers(
        partitions, keys, workers.start, workers.stop, workers.alive, lease_ms_for(period)
    )
    # An event, not a flag read after `time.sleep(period)`: a sleep resumes after the handler,
    # so a stop waited out the poll interval (30 s of it, the workers undrained, past a
    # `docker stop`'s 10 s before its SIGKILL); `wait` returns as the handler sets it.
    stopping = threading.Event()
    # SIGHUP too (its terminal closed): left to its default, the workers ran on undrained
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda _signum, _frame: stopping.set())
    try:
        while not stopping.is_set():
            stack.reap_stopped()
            stack.cap_logs()
            for scaler in scalers:
                _tick(scaler, client)
            stopping.wait(period)
    finally:  # every pool's workers drain side by side, with those stopped before
        try:
            _release_leases(scalers, client)
        finally:  # whatever the release raised: skipped, the drain left the workers running
            workers.drain([name for scaler in scalers for name in scaler.workers])
            client.close()


def _release_leases(scalers: list[PoolScaler], client: redis.Redis) -> None:
    """Each pool this autoscaler led is free for another at once; Redis out of reach, or
    refusing the release (a lease of another type, an ACL's NOPERM), its lease lapses as it
    would have, and the stop goes on to the drain."""
    import redis

    from shared.partition_stats import wrong_type
    from shared.redis_client import OUT_OF_REACH, WRITES_REFUSED, topology_read

    try:
        with topology_read():
            for scaler in scalers:
                scaler.release(client)
    except OUT_OF_REACH as exc:
        click.echo(f"leases left to lapse: redis unavailable ({exc})", err=True)
    except WRITES_REFUSED as exc:  # it ended the stop before the workers were drained
        click.echo(f"leases left to lapse: redis refuses writes ({exc})", err=True)
    except redis.RedisError as exc:  # an ACL's NOPERM raised, a traceback past the drain
        why = "a key of another type" if wrong_type(exc) else "redis refused the release"
        click.echo(f"leases left to lapse: {why} ({exc})", err=True)


def _tick(scaler: PoolScaler, client: redis.Redis, now: float | None = None) -> None:
    """One poll (at `now`, as `PoolScaler.tick`'s); a Redis outage keeps the pool as it is until
    the next (as KEDA does): it stopped the autoscaler, and with it every worker it had started.
    A cluster's count too: one failing over (CLUSTERDOWN), one no node answers
    (ClusterUnreachable). So does a Redis that refuses writes (at its maxmemory with
    noeviction, a failover's old master): the lease's renewal is a write. And a key of the pool
    of another type (an operator's slip), which the producer's queue state leaves out too."""
    import redis

    from conveyor.stack import ChildNotReady
    from shared.partition_stats import unless_wrong_type
    from shared.redis_client import OUT_OF_REACH, WRITES_REFUSED, topology_read

    try:
        with topology_read():
            count = scaler.tick(client, now)
    except OUT_OF_REACH as exc:
        click.echo(f"{scaler.name}: redis unavailable ({exc}); replicas kept", err=True)
        return
    except WRITES_REFUSED as exc:
        click.echo(f"{scaler.name}: redis refuses writes ({exc}); replicas kept", err=True)
        return
    except redis.ResponseError as exc:  # one pool's slip ended the autoscaler, every pool's too
        unless_wrong_type(exc)
        click.echo(f"{scaler.name}: a key of another type ({exc}); replicas kept", err=True)
        return
    # it ended the autoscaler with a traceback, every worker too
    except (ChildNotReady, WorkerNotSpawned) as exc:
        click.echo(
            f"{scaler.name}: a worker did not start ({exc}); backing off before another",
            err=True,
        )
        return
    if not scaler.leading:
        click.echo(f"{scaler.name}: scaled by another autoscaler (it holds the pool's lease)")
        return
    held = f" ({scaler.held})" if scaler.held else ""  # CrashLoopBackOff, in the pool's words
    click.echo(f"{scaler.name} replicas={count}{held}")


class WorkerNotSpawned(RuntimeError):
    """A worker that could not be spawned: the model repository, read anew for each one, broke
    since the autoscaler started (a typo in any model's config.yaml), or no process or log file
    could be made. It ended the autoscaler, and every pool's workers with it."""


@dataclass
class PoolWorkers:
    """The stack's workers as the scalers start, confirm and stop them, none waited for: a
    start waited for its engine to load, a stop for its drain (up to CONVEYOR_SHUTDOWN_GRACE_S
    + 20 s), and meanwhile no pool was polled; a scale-up by N loaded N engines in turn."""

    stack: Stack
    ready_by: dict[str, float] = field(default_factory=dict)  # started, not yet seen ready

    def start(self, pool: str, name: str) -> str:
        """Spawn a worker serving `pool`; the polls after confirm it gets ready (`alive`)."""
        from shared.model_repository import ModelConfigError

        try:
            self.stack.spawn_worker(pool, name=name)
        except BaseException as exc:  # spawned, then failed: it ran on, counted by no pool
            if name in self.stack.processes:
                self.stack.terminate([name])
            if isinstance(exc, ModelConfigError | OSError):
                raise WorkerNotSpawned(f"{name}: {exc}") from exc
            raise
        self.ready_by[name] = time.monotonic() + self.stack.start_timeout_s
        return name

    def alive(self, name: str) -> bool:
        """Whether worker `name` runs. One still starting that died or was not ready within
        CONVEYOR_START_TIMEOUT_S is stopped and the error raised (left running, it was counted
        by no pool and outlived the autoscaler). One whose readiness Redis cannot tell now is
        kept while it runs, still starting: its deadline applies at the first look Redis
        answers (stopped, an LLM worker lost minutes of loading to a one-second restart). One
        that died is stopped as a scaled-down one is: what it left in its process group goes
        too (counted out and forgotten, a killed LLM worker's engine-core process ran on)."""
        from shared.redis_client import OUT_OF_REACH, topology_read

        if name in self.ready_by:
            try:
                with topology_read():
                    if self.stack.poll_ready(name, self.ready_by[name]):
                        del self.ready_by[name]
            except OUT_OF_REACH:  # kept, and its deadline; one that died meanwhile stopped below
                pass
            except BaseException:
                self.stop([name])
                raise
        running = self.stack.running(name)
        if not running and name not in self.stack.stopping:
            self.stop([name])
        return running

    def stop(self, names: list[str]) -> None:
        """SIGTERM, not waited for: they drain while the pools are polled on, and the loop
        reaps them (`Stack.reap_stopped`)."""
        for name in names:
            self.ready_by.pop(name, None)
        self.stack.terminate(names)

    def drain(self, names: list[str]) -> None:
        """Ctrl-C: stop `names`, then wait until they and those stopped before have exited,
        side by side, each killed `Stack.stop_timeout_s` after its SIGTERM."""
        self.stop(names)
        while self.stack.stopping:
            self.stack.reap_stopped()
            time.sleep(0.1)
