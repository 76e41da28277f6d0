"""A key's places among its open streams (`shared/rate_limit.StreamLimiter`), taken by every
long-lived feed it opens: `/v1` job event streams, the console's token views and its summary
feeds share the key's cap."""

from __future__ import annotations

import uuid

from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError
from producer_api.state import ProducerState


async def take_place(state: ProducerState, principal: Principal) -> str | None:
    """A place among the key's open streams (its id; None with auth off) under the key's cap
    (its own `max_streams`, else CONVEYOR_MAX_STREAMS_PER_KEY), or 429: each open stream holds
    a server task and a socket, and polls Redis while its job is queued, so streams beyond the
    cap would starve every tenant."""
    if principal.quota is None:
        return None
    place, cap = uuid.uuid4().hex, principal.quota.max_streams
    if not await state.open_streams.hold(principal.limits_id, place, cap):
        message = f"this API key has {cap} event streams open; retry when one is closed"
        raise ConveyorError(429, "too_many_streams", message, {"Retry-After": "1"})
    return place
