"""`conveyor autoscale`: run worker processes for the given pools and scale them from queue
depth with KEDA's formula, until Ctrl-C (which drains them)."""

from __future__ import annotations

import functools
import signal
import time
from pathlib import Path

import click
import redis

from autoscaling.local_autoscaler import PoolScaler, pool_scalers
from conveyor.finite_float import FiniteFloat
from conveyor.local_stack import NO_STACK, redis_url, refuse_unreachable
from conveyor.stack import ChildNotReady, Stack
from shared.keys import Keys
from shared.model_repository import ModelRepository
from shared.redis_client import OUT_OF_REACH, topology_read
from shared.settings import get_settings


@click.command("autoscale")
@click.option("--models", required=True, help="Pools: `model` (all variants) or `model:variant`.")
@click.option(
    "--interval",
    default=None,
    type=FiniteFloat(min=0, min_open=True),
    help="Seconds between polls (default: the models' polling_interval_s).",
)
@click.option(
    "--state-dir", default=Path("var/autoscale"), type=click.Path(path_type=Path), help="Logs."
)
def command(models: str, interval: float | None, state_dir: Path) -> None:
    """Scale workers between each model's min and max replicas, as KEDA would."""
    settings = get_settings()
    stack = Stack.create(state_dir, redis_url(settings), cluster=settings.redis_cluster)
    keys = Keys(settings.key_prefix)
    partitions = ModelRepository.load(settings.model_repository).partitions(models.split(","))
    scalers = pool_scalers(
        partitions,
        keys,
        functools.partial(start_pool_worker, stack),
        stack.stop_processes,
        stack.running,
    )
    period = interval or min(c.autoscaling.polling_interval_s for c, _ in partitions)
    refuse_unreachable(stack.redis_url, NO_STACK)
    client = stack.client()
    stopping: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _: stopping.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    try:
        while not stopping:
            for scaler in scalers:
                _tick(scaler, client)
            time.sleep(period)
    finally:  # every pool's workers drain side by side
        stack.stop_processes([name for scaler in scalers for name in scaler.workers])
        client.close()


def _tick(scaler: PoolScaler, client: redis.Redis) -> None:
    """One poll; a Redis outage keeps the pool as it is until the next (as KEDA does): it
    stopped the autoscaler, and with it every worker it had started. A cluster's count too:
    one failing over (CLUSTERDOWN), one no node answers (ClusterUnreachable)."""
    try:
        with topology_read():
            count = scaler.tick(client)
    except OUT_OF_REACH as exc:
        click.echo(f"{scaler.name}: redis unavailable ({exc}); replicas kept", err=True)
        return
    except ChildNotReady as exc:  # it ended the autoscaler with a traceback, every worker too
        click.echo(
            f"{scaler.name}: a worker did not start ({exc}); next poll tries again", err=True
        )
        return
    click.echo(f"{scaler.name} replicas={count}", nl=True)


def start_pool_worker(stack: Stack, pool: str, name: str) -> str:
    """A worker serving `pool`; one that does not get ready, or whose readiness Redis could
    not confirm, is stopped (it was left running, counted by no pool, and outlived the
    autoscaler)."""
    try:
        stack.start_worker(pool, name=name)
    except BaseException:
        if name in stack.processes:
            stack.stop_process(name)
        raise
    return name
