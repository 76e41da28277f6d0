"""Returns its inputs unchanged: the engine that costs nothing, so benchmarks see the pipeline."""

from __future__ import annotations

from typing import Any

from workers.engines.base import BatchEngine


class IdentityEngine(BatchEngine):
    inline = True

    def load(self) -> None:
        """Nothing to load."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs
