"""A Redis URL's password stays out of the one-line errors the CLI prints (a terminal, a CI log,
a pod's log): `cannot reach Redis at redis://app:s3cret@…` gave it to whoever read them."""

from __future__ import annotations

import click
import pytest

from conveyor.local_stack import refuse_unreachable
from conveyor.stack import free_port


def test_an_unreachable_redis_is_named_without_its_password() -> None:
    url = f"redis://app:s3cret@127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(click.ClickException) as refused:
        refuse_unreachable(url, "check CONVEYOR_REDIS_URL")
    line = refused.value.format_message()
    assert "s3cret" not in line
    assert line.startswith("cannot reach Redis at redis://app:***@127.0.0.1:"), line
