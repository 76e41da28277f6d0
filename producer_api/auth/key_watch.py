"""Whether the API key a stream was opened with may still be used: a token stream or a job's
events outlived the key's revocation or expiry for as long as the job ran."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from producer_api.auth.principal import ANONYMOUS, Principal
from producer_api.errors import ConveyorError
from producer_api.task_cancel import first_done
from shared.api_keys import ApiKeyStore

REVOKED = "API key revoked or expired"
PLACE_LOST = (
    "this stream's place among the API key's open event streams lapsed unrenewed (its client"
    " stopped reading) and another stream took it; reconnect when one is closed"
)


class KeyWatch:
    """A stream's look at its key, for `live_feed.while_holds`; remembers whether the key was
    found no longer good, so the stream can end saying so. `renew`, if given, runs on each look
    too: a job-event stream's place among its key's open streams, which lapses unrenewed."""

    def __init__(
        self,
        keys: ApiKeyStore,
        principal: Principal,
        renew: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.keys = keys
        self.principal = principal
        self.renew = renew
        self.revoked = False

    async def holds(self) -> bool:
        """True with auth off, and while the key is neither revoked nor expired; a Redis that
        does not answer cuts no stream (its own reads say so). A renewal that finds the place
        taken raises the 429 `too_many_streams` a stream refused at open gets: streaming on, the
        key held more streams than its cap."""
        if self.principal.key_id == ANONYMOUS.key_id:
            return True
        try:
            if self.renew is not None and not await self.renew():
                raise ConveyorError(429, "too_many_streams", PLACE_LOST)
            self.revoked = await self.keys.usable(self.principal.key_id) is None
        except RedisError:
            return True
        return not self.revoked

    async def wait(self, upcoming: asyncio.Future[Any], every_s: float) -> None:
        """Until `upcoming` is done or the key, looked at every `every_s`, is found no longer
        good (`revoked` then): a request that reads nothing while it waits (a streamed one's
        queued job's first event) notices a revoked key all the same. The first look is one
        period in: a wait over before costs no read."""
        lapse = await first_done(self._lapse(every_s), [upcoming])
        if not lapse.cancelled():
            lapse.result()  # its error, if a look raised one

    async def _lapse(self, every_s: float) -> None:
        """Returns once `holds` says no."""
        await asyncio.sleep(every_s)
        while await self.holds():
            await asyncio.sleep(every_s)
