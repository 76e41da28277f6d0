"""`GET /v1/models` says which partitions workers serve now, by heartbeat (`serving`,
`warming`), as a job's `scaling` event does: its `consumers` is the consumer group's member
count, which keeps a killed worker until another worker of the partition prunes it, so a
partition whose only worker was killed showed a consumer for good while nothing served it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import running_stack, until

# A killed worker reads as gone once its record's TTL passes: 3 s here, not the default 10 s.
HEARTBEAT = {"CONVEYOR_WORKER_HEARTBEAT_S": "0.5", "CONVEYOR_WORKER_HEARTBEAT_TTL_S": "3"}


def _partition(base_url: str, variant: str, listed: bool = False) -> dict[str, Any]:
    """The partition as `GET /v1/models/identity` shows it, or as the list does."""
    if listed:
        [card] = [
            c for c in httpx.get(f"{base_url}/v1/models").json()["data"] if c["id"] == "identity"
        ]
    else:
        card = httpx.get(f"{base_url}/v1/models/identity").json()
    [partition] = [p for p in card["partitions"] if p["variant"] == variant]
    return dict(partition)


def test_a_killed_workers_partition_reads_as_served_by_none(tmp_path: Path) -> None:
    with running_stack(tmp_path, CONVEYOR_AUTH="disabled", **HEARTBEAT) as stack:
        pid = stack.start_worker("identity:default")
        served = until(lambda: (p := _partition(stack.base_url, "default"))["serving"] and p)
        assert (served["serving"], served["warming"], served["consumers"]) == (1, 0, 1)
        # the list says so too, read until it does: the worker's beats (TTL 3 s) may lapse
        # between two reads on a loaded machine, its record gone until the next beat
        until(lambda: _partition(stack.base_url, "default", listed=True)["serving"] == 1)
        assert _partition(stack.base_url, "canary")["serving"] == 0
        os.kill(pid, signal.SIGKILL)
        gone = until(lambda: (p := _partition(stack.base_url, "default"))["serving"] == 0 and p)
        assert (gone["warming"], gone["consumers"]) == (0, 1)  # the group still lists it
        assert _partition(stack.base_url, "default", listed=True) == gone
