"""A producer shares its port only when asked (`--share-port`, which `conveyor up --producers N`
passes to each of its N): always bound with SO_REUSEPORT, a second server started by mistake on
a taken port never failed, it silently took part of the first one's connections, where uvicorn's
command line exits on "address already in use"."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from uvicorn.config import STARTUP_FAILURE

from conveyor.stack import Stack, free_port
from tests.conftest import until


@pytest.fixture
def fresh() -> Iterator[httpx.Client]:
    """A client that opens a new connection for every request: the kernel picks a producer
    per connection."""
    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


@pytest.fixture
def mine(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """Producers of a test's own, on the session's Redis; stopped after it."""
    own = Stack.create(tmp_path, stack.redis_url)
    try:
        yield own
    finally:
        own.stop()


def _answering(fresh: httpx.Client, url: str) -> set[str]:
    """The instance ids of the producers that take 40 new connections to `url`."""
    return {fresh.get(f"{url}/healthz", timeout=10).json()["instance"] for _ in range(40)}


def test_a_second_lone_producer_on_a_taken_port_exits_3_and_the_first_answers_alone(
    mine: Stack, fresh: httpx.Client
) -> None:
    port = free_port()
    url = mine.start_producer(port, "first")
    second = mine.start_producer_process(port, "second")
    until(lambda: second.poll() is not None or "second" in _answering(fresh, url), timeout=60)
    assert second.returncode == STARTUP_FAILURE, "the second producer bound the taken port"
    said = mine.log_path("second").read_text()
    assert f"error while attempting to bind on address ('127.0.0.1', {port})" in said, said
    assert "address already in use" in said and "Traceback" not in said, said
    assert _answering(fresh, url) == {"first"}


def test_producers_asked_to_share_the_port_all_answer_a_restarted_one_too(
    mine: Stack, fresh: httpx.Client
) -> None:
    """As `conveyor up --producers 2` starts them, and as its supervisor restarts one that
    died: the replacement binds beside the live one."""
    url = mine.start_producers(free_port(), 2, "shared")
    until(lambda: _answering(fresh, url) == {"shared-1", "shared-2"}, timeout=60)
    first = mine.processes["producer-1"]
    first.kill()
    first.wait()
    mine.exited("producer-1")
    until(lambda: not mine.lingering("producer-1"), timeout=30)
    assert _answering(fresh, url) == {"shared-2"}
    mine.respawn("producer-1")
    until(lambda: _answering(fresh, url) == {"shared-1", "shared-2"}, timeout=60)


def test_a_lone_producer_that_died_rebinds_its_port_past_its_connections_time_wait(
    mine: Stack,
) -> None:
    """A lone producer does not share its port, yet still binds with SO_REUSEADDR, as uvicorn
    does: the connections of the one that died linger in TIME_WAIT, which otherwise failed the
    restart's bind (`conveyor up` restarting its only producer) for a minute."""
    url = mine.start_producers(free_port(), 1, "lone")
    with httpx.Client() as kept:  # a connection the producer's death closes first
        assert kept.get(f"{url}/healthz", timeout=10).json()["instance"] == "lone"
        os.kill(mine.processes["producer"].pid, signal.SIGKILL)
        mine.processes["producer"].wait()
    mine.exited("producer")
    until(lambda: not mine.lingering("producer"), timeout=30)
    restarted = mine.respawn("producer")
    until(lambda: restarted.poll() is not None or _up(url), timeout=60)
    assert restarted.poll() is None, mine.log_tail("producer")


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
