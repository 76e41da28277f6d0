"""A worker refuses at start what would leave it serving nothing while it looks healthy."""

from __future__ import annotations

import pytest

from shared.model_repository import ModelConfigError
from shared.settings import Settings
from workers.runtime.consumer_runtime import ConsumerRuntime


def test_a_worker_told_to_serve_nothing_refuses_to_start() -> None:
    """Without CONVEYOR_MODELS a worker used to start, idle and report itself alive."""
    with pytest.raises(ModelConfigError, match=r"^CONVEYOR_MODELS is empty: name what this worker"):
        ConsumerRuntime(Settings(models=[]))
    with pytest.raises(ModelConfigError, match=r"^unknown model 'minlm'"):
        ConsumerRuntime(Settings(models=["minlm"]))
