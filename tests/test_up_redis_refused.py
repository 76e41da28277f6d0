"""A Redis that answers `conveyor up` (and `conveyor autoscale`) as it starts, but with an
error, is one line before anything starts, as one that does not answer is: a database index
the server lacks (`CONVEYOR_REDIS_URL=redis://host:6379/99`) ended `up` with a traceback."""

from __future__ import annotations

from urllib.parse import urlsplit

import click
import pytest

from conveyor.local_stack import refuse_unreachable


def test_a_database_the_server_lacks_is_one_line(redis_url: str) -> None:
    parts = urlsplit(redis_url)
    if parts.scheme != "redis":  # a database chosen by path: redis:// alone
        pytest.skip(f"a database in the path of {parts.scheme}:// URLs")
    missing = parts._replace(path="/99").geturl()  # Valkey has 16 databases
    with pytest.raises(click.ClickException) as refused:
        refuse_unreachable(missing, "check CONVEYOR_REDIS_URL")
    assert refused.value.message == (
        f"cannot use Redis at {missing} (DB index is out of range); check CONVEYOR_REDIS_URL"
    )
