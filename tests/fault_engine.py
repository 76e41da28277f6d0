"""A real engine for fault tests (loaded as the custom backend `tests.fault_engine:FaultEngine`):
returns its inputs, but an item can make the batch raise, make the process die mid-batch, or
the batch can take time, so the tests inject faults through ordinary job inputs."""

from __future__ import annotations

import os
import time
from typing import Any

from workers.engines.base import BatchEngine

FIXED_ENV = "CONVEYOR_TEST_POISON_FIXED"


class FaultEngine(BatchEngine):
    inline = False

    def load(self) -> None:
        self.fixed = os.environ.get(FIXED_ENV) == "1"

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        actions = {item.get("action") for item in inputs}
        if "crash" in actions and not self.fixed:
            os._exit(3)
        if "raise" in actions:
            tags = [item.get("tag") for item in inputs if item.get("action") == "raise"]
            raise ValueError(f"poison item {tags}")
        time.sleep(max((item.get("sleep_ms", 0) for item in inputs), default=0) / 1000)
        return [{**item, "pid": os.getpid()} for item in inputs]
