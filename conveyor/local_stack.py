"""How the CLI finds the stack `conveyor up` runs on this machine: `up` writes its Redis URL
(and whether it is a cluster's), producer URL and development key file to
`<CONVEYOR_STATE_DIR>/stack.json` (the embedded Valkey listens on a random port), and the
Redis-backed commands (`keys`, `dlq`, `autoscale`) read it when `CONVEYOR_REDIS_URL` is not
set. A Redis they cannot reach ends the command with one line that says where they looked, not
a traceback."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, get_type_hints

import click

from shared.settings import Settings, get_settings, masked_url

if TYPE_CHECKING:
    import redis.asyncio as aioredis

T = TypeVar("T")
STATE_FILE = "stack.json"
PIDS = range(1, 2**31)  # a process's id: a positive pid_t (a signed 32-bit integer)
PROC = Path("/proc")  # Linux's: each process's start time, and the boot's id


@dataclass(frozen=True)
class StackState:
    redis_url: str
    producer_url: str
    dev_key_file: str  # empty when auth is disabled
    pid: int  # the `conveyor up` process: a state file it left behind (kill -9) is ignored
    # a cluster's node: its client must be a cluster client (a single server's failed on MOVED);
    # false in a state file an older `conveyor up` wrote
    redis_cluster: bool = False
    # The `up` process's start (clock ticks since boot) and the boot's id: after a restart its
    # pid may be another process's, which is then no stack. 0 and "" in a state file an older
    # `up` wrote, or one written without /proc: its pid alone is believed.
    start_ticks: int = 0
    boot_id: str = ""

    def __post_init__(self) -> None:
        """Each field of the type `up` writes, the pid a process's: an edited file's
        `"pid": "12"` ended every command with `os.kill`'s traceback, and a pid of 0, which
        `os.kill` takes for the command's own process group, named a stack long gone."""
        types = get_type_hints(type(self))
        for item in fields(self):
            value = getattr(self, item.name)
            if type(value) is not types[item.name]:
                raise TypeError(f"{item.name} {value!r} is no {types[item.name].__name__}")
        if self.pid not in PIDS:
            raise ValueError(f"pid {self.pid} is no process's")

    @classmethod
    def for_this_process(
        cls, redis_url: str, producer_url: str, dev_key_file: str, cluster: bool
    ) -> StackState:
        """The state of the stack this process (`conveyor up`) runs, its start included."""
        pid = os.getpid()
        ticks, boot_id = process_start(pid) or (0, "")
        return cls(redis_url, producer_url, dev_key_file, pid, cluster, ticks, boot_id)

    def write(self, state_dir: Path) -> Path:
        """Whole or not at all (a file renamed into place): a command that read it while
        `up` wrote it found it empty, and ended with a traceback."""
        path = state_dir / STATE_FILE
        partial = path.with_name(f".{STATE_FILE}.{os.getpid()}")
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        partial.replace(path)
        return path

    @classmethod
    def read(cls, state_dir: Path) -> StackState | None:
        """The running stack's state, or None when there is none. One it cannot read (cut
        short, edited) ends the command with one line naming it: every command, not only
        those that need the stack, read it, and each ended with a traceback."""
        path = state_dir / STATE_FILE
        if not path.exists():
            return None
        try:
            state = cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise click.ClickException(
                f"cannot read {path.absolute()} ({exc}): `conveyor up` writes it while it "
                "runs; remove it if none runs on that state dir"
            ) from None
        return state if _alive(state) else None

    @property
    def dev_key(self) -> str | None:
        """The development key; its file gone (removed while `up` runs) is one line."""
        if not self.dev_key_file:
            return None
        try:
            return Path(self.dev_key_file).read_text().strip()
        except OSError as exc:
            raise click.ClickException(
                f"cannot read the development key ({exc}): pass --api-key (CONVEYOR_API_KEY), "
                "or restart `conveyor up`, which writes it"
            ) from None

    @staticmethod
    def remove(state_dir: Path) -> None:
        (state_dir / STATE_FILE).unlink(missing_ok=True)


def _alive(state: StackState) -> bool:
    """Whether the `conveyor up` that wrote the state still runs; a pid now another user's (a
    permission error, a traceback in every command before) or another process's (started at
    another time, or in another boot) is not it."""
    try:
        os.kill(state.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not state.boot_id:  # an older `up`'s file: its pid alone
        return True
    now = process_start(state.pid)
    return now is None or now == (state.start_ticks, state.boot_id)


def process_start(pid: int) -> tuple[int, str] | None:
    """When `pid` started (clock ticks since boot, /proc/<pid>/stat's field 22) and the boot's
    id: together they name one process across pid reuse and restarts. None without /proc (not
    Linux), or once the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        boot_id = (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return None
    # field 2, the command's name in parentheses, may hold spaces and `)`: field 3 on follow
    # its last `)`, field 22 the 20th of them
    return int(stat.rsplit(")", 1)[1].split()[22 - 3]), boot_id


def stack_redis(settings: Settings) -> Settings:
    """`settings` with the CLI's Redis: CONVEYOR_REDIS_URL (CONVEYOR_REDIS_CLUSTER too) when set,
    else the running `conveyor up`'s URL and whether it is a cluster, else the defaults."""
    if "CONVEYOR_REDIS_URL" in os.environ:
        return settings
    state = StackState.read(settings.state_dir)
    if state is None:
        return settings
    return settings.model_copy(
        update={"redis_url": state.redis_url, "redis_cluster": state.redis_cluster}
    )


def with_redis(action: Callable[[aioredis.Redis, Settings], Awaitable[T]]) -> T:
    """Run `action` on a client of the CLI's Redis; unreachable or unusable is one clear line.
    Redis is imported by the two functions that connect, not by this module: every SDK-backed
    command reads StackState, and importing redis cost each a third of a second of CPU."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from shared.redis_client import connect

    settings = stack_redis(get_settings())
    url = settings.redis_url

    async def main() -> T:
        client = connect(settings.redis_url, blocks_ms=0, cluster=settings.redis_cluster)
        try:
            return await action(client, settings)
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise unreachable(url, exc, NO_STACK) from None
    except RedisError:
        # Redis's own refusal on connecting (a database it lacks, `/99`: a traceback) is one
        # line, as a PING then shows it; an error of the command itself stays as it was.
        refuse_unreachable(url, NO_STACK, settings.redis_cluster)
        raise


# What a command that needs the stack's Redis advises when it does not answer.
NO_STACK = (
    "start the stack with `conveyor up`, or set CONVEYOR_REDIS_URL (or CONVEYOR_STATE_DIR to "
    "the `conveyor up` state dir)"
)


def unreachable(url: str, error: Exception, advice: str) -> click.ClickException:
    return click.ClickException(f"cannot reach Redis at {masked_url(url)} ({error}); {advice}")


def refuse_unreachable(url: str, advice: str, cluster: bool | None = None) -> None:
    """One line before anything starts, for a Redis that does not answer, or answers with an
    error (a command that starts processes would otherwise wait on, or die with a traceback)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from shared.redis_client import connect

    async def ping() -> None:
        client = connect(url, blocks_ms=0, cluster=cluster)
        try:
            await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(ping())
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise unreachable(url, exc, advice) from None
    except RedisError as exc:  # it answers with an error: a database it lacks (`/99`)
        message = f"cannot use Redis at {masked_url(url)} ({exc}); {advice}"
        raise click.ClickException(message) from None
