"""`/healthz`: the process is alive; `/readyz`: it can serve (not asked to exit, Redis answers,
its Redis-side startup has run: `startup.py`, models known). Asked to exit (SIGTERM), it is
unready at once, before any wait is ended (`Draining.exiting`).
Readiness answers within `READY_TIMEOUT_S` whatever Redis does, so a load balancer's probe sees
a 503 rather than timing out on a frozen Redis. On a cluster, the Redis asked is the master of
the control plane's slot (`{ctl}`: API keys, routes), which every authenticated request reads:
redis-py's default node (the master of slot 0) said ready while that master was gone, and not
ready while only another master was."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends
from redis.exceptions import AuthenticationError, RedisError

from producer_api.errors import error_response
from producer_api.redis_outage import named
from producer_api.responses import FastJSONResponse
from producer_api.state import ProducerState, producer_state
from shared.keys import Keys
from shared.redis_client import OUT_OF_REACH, RedisClient, is_cluster

router = APIRouter(tags=["health"])
READY_TIMEOUT_S = 0.5


# HEAD as well as GET: a load balancer or monitor that checks with HEAD got 405 (RFC 9110 has
# every general-purpose server support it), a healthy producer taken for down.
@router.get("/healthz")
@router.head("/healthz", include_in_schema=False)
async def healthz(state: Annotated[ProducerState, Depends(producer_state)]) -> dict[str, str]:
    """Alive, and which producer this is (`conveyor up` checks its port answers as its own)."""
    return {"status": "ok", "instance": state.settings.instance_id}


@router.get("/readyz")
@router.head("/readyz", include_in_schema=False)
async def readyz(state: Annotated[ProducerState, Depends(producer_state)]) -> FastJSONResponse:
    if state.draining.exiting():
        return _unready("stopping: the producer was asked to exit")
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await _ping(state.redis, state.keys)
    except AuthenticationError as exc:  # a ConnectionError, but no outage: say what it is
        return _unready(f"redis: {named(exc)}")
    except (RedisError, *OUT_OF_REACH, TimeoutError) as exc:
        return _unready(f"redis unreachable: {exc!r}")
    if (waiting := state.startup.unready()) is not None:
        return _unready(f"starting: the producer's Redis-side startup has not run ({waiting})")
    if not state.repository.models:
        return _unready("no models in the repository")
    return FastJSONResponse({"status": "ready", "models": sorted(state.repository.models)})


def _unready(message: str) -> FastJSONResponse:
    """Every unready answer alike: 503 with `Retry-After`, as the API's other 503s (the one
    for no models came without it)."""
    return error_response(503, "unavailable", message, {"Retry-After": "1"})


async def _ping(client: RedisClient, keys: Keys) -> None:
    """PING the server, or the cluster's master of the control plane's slot as known now (the
    topology read first if a failed command left it to read again)."""
    if not is_cluster(client):
        await client.ping()
        return
    cluster = cast(Any, client)
    await cluster.initialize()
    owner = cluster.get_node_from_key(keys.api_key_index)
    await cluster.execute_command("PING", target_nodes=owner)
