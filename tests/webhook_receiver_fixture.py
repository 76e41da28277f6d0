"""The `receiver` fixture of the webhook target tests (a pytest plugin: conftest registers it,
where importing a fixture into a test module trips ruff's F811): a real local receiver, with
deliveries that give up after 10 s (a loaded machine's stall is no timeout) and are signed. A
module needing other settings defines its own `receiver`, which overrides this one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.webhook_receiver import Receiver, serving


@pytest.fixture
def receiver(settings_env: Callable[..., None]) -> Iterator[Receiver]:
    settings_env(CONVEYOR_WEBHOOK_TIMEOUT_S="10", CONVEYOR_WEBHOOK_SECRET="whsec-test")
    with serving() as server:
        yield server
