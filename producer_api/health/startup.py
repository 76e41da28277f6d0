"""The producer's Redis-side startup (consumer groups, scripts, reply subscriptions, live routes),
retried in the background until it has run once whole, and `/readyz` unready until then. A
producer started while Redis was away skipped it for good and said ready at the first PING
Redis answered: admission's scripts never loaded, no group for KEDA to measure, config.yaml's
split routing its first requests. Every step is idempotent, so a try cut halfway runs again.
Credentials Redis refuses at the first try end the start (`refuse_start`): no wait mends them,
and a producer that waited them out answered 503 for ever, its log an outage's."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import NoReturn

from redis.exceptions import RedisError

from producer_api.redis_outage import RedisOutage, named
from producer_api.task_cancel import cancel_and_wait
from shared.redis_client import OUT_OF_REACH, CredentialsRefused, credentials_checked

log = logging.getLogger(__name__)
NAME = "redis-side startup"
Steps = Callable[[], Awaitable[None]]


class Startup:
    def __init__(self) -> None:
        self._unready: str | None = "not tried yet"
        self._task: asyncio.Task[None] | None = None

    def unready(self) -> str | None:
        """Why the producer is not ready yet (its last try's error, for `/readyz` to name), or
        None once the Redis-side startup has run whole."""
        return self._unready

    async def run(self, steps: Steps) -> None:
        """`steps` now, before the port opens; if they fail (Redis out of reach, or otherwise),
        again in the background, backing off, until they succeed. Raises CredentialsRefused if
        Redis refuses the credentials now; refused at a later try (a password rotated while
        Redis was away), they are waited out as an outage."""
        outage = RedisOutage(NAME)
        delay = await self._try(partial(_first_try, steps), outage)
        if delay is not None:
            self._task = asyncio.create_task(self._retry(steps, outage, delay), name=NAME)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _retry(self, steps: Steps, outage: RedisOutage, delay: float | None) -> None:
        """Tries until one succeeds."""
        while delay is not None:
            await asyncio.sleep(delay)
            delay = await self._try(steps, outage)

    async def _try(self, steps: Steps, outage: RedisOutage) -> float | None:
        """One try of `steps`: None once they ran whole, else the seconds to wait first. A try
        that fails otherwise than by Redis (a bug, a bad value read) is logged and tried again,
        so the producer never sits unready in silence; the first try's too: raised out of the
        app's startup, a live routes document that did not parse kept the producer from
        starting at all (a crash loop)."""
        try:
            await steps()
        except CredentialsRefused:
            raise
        except (RedisError, *OUT_OF_REACH) as exc:
            self._unready = named(exc)
            return outage.failed(exc)
        except Exception as exc:
            log.exception("%s failed; trying again", NAME)
            self._unready = type(exc).__name__  # its message stays in the log, off a probe
            return outage.failed(exc)
        outage.recovered()
        self._unready = None
        return None


async def _first_try(steps: Steps) -> None:
    """The first try, whose refused login is a misconfiguration (CredentialsRefused)."""
    with credentials_checked():
        await steps()


def refuse_start(reason: Exception) -> NoReturn:
    """End the producer's start in one plain `Error:` line on stderr, exit 1, as a bad setting
    or config.yaml ends it. Raised out of the lifespan, an error reached the log as Starlette's
    whole traceback, then uvicorn's `Application startup failed` (exit 3), so the process ends
    here, before its port opens: nothing is served or held yet that an orderly exit would hand
    back."""
    print(f"Error: the producer cannot start: {reason}", file=sys.stderr, flush=True)
    os._exit(1)
