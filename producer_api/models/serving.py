"""Queue statistics per partition, read with XINFO in one pipelined round trip for all models."""

from __future__ import annotations

from typing import Any

from producer_api.state import ProducerState
from shared.keys import GROUP
from shared.model_repository import ModelConfig


class ModelsService:
    def __init__(self, state: ProducerState) -> None:
        self.state = state

    async def list_models(self) -> dict[str, Any]:
        partitions = [(c, v) for c in self.state.repository for v in c.variants]
        keys = self.state.keys
        pipe = self.state.redis.pipeline(transaction=False)
        for config, variant in partitions:
            pipe.xinfo_groups(keys.queue(config.name, variant))
            pipe.xlen(keys.queue(config.name, variant))
            pipe.xlen(keys.bulk_queue(config.name, variant))
            pipe.xlen(keys.dlq(config.name, variant))
        results = await pipe.execute(raise_on_error=False)
        cards: dict[str, dict[str, Any]] = {}
        for index, (config, variant) in enumerate(partitions):
            groups, length, bulk, dlq = results[index * 4 : index * 4 + 4]
            card = cards.setdefault(config.name, _card(config))
            card["partitions"].append(
                {
                    "variant": variant,
                    "stream": keys.queue(config.name, variant),
                    "length": _int(length),
                    "bulk_length": _int(bulk),
                    "dlq_depth": _int(dlq),
                    **_group_stats(groups),
                }
            )
        return {"object": "list", "data": list(cards.values())}


def _card(config: ModelConfig) -> dict[str, Any]:
    return {
        "id": config.name,
        "object": "model",
        "owned_by": "conveyor",
        "kind": config.kind,
        "backend": config.backend,
        "default_variant": config.default_variant,
        "partitions": [],
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _group_stats(groups: Any) -> dict[str, Any]:
    """Lag, pending and consumers of the `workers` group (zeros before any worker started)."""
    for group in groups if isinstance(groups, list) else []:
        name = group.get("name")
        if name in (GROUP, GROUP.encode()):
            lag = group.get("lag")
            return {
                "lag": None if lag is None else int(lag),
                "pending": int(group.get("pending", 0)),
                "consumers": int(group.get("consumers", 0)),
            }
    return {"lag": 0, "pending": 0, "consumers": 0}
