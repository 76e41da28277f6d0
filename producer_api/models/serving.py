"""The models list: each model of the repository with its partitions' queue state."""

from __future__ import annotations

from typing import Any

from producer_api.state import ProducerState
from shared.partition_stats import PartitionStats, read_partition_stats


class ModelsService:
    def __init__(self, state: ProducerState) -> None:
        self.state = state

    async def list_models(self) -> dict[str, Any]:
        state = self.state
        stats = await read_partition_stats(state.redis, state.keys, state.repository)
        cards: dict[str, dict[str, Any]] = {
            config.name: {
                "id": config.name,
                "object": "model",
                "owned_by": "conveyor",
                "kind": config.kind,
                "task": config.task,
                "backend": config.backend,
                "default_variant": config.default_variant,
                "partitions": [],
            }
            for config in state.repository
        }
        for partition in stats:
            cards[partition.model]["partitions"].append(_partition(partition))
        return {"object": "list", "data": list(cards.values())}


def _partition(stats: PartitionStats) -> dict[str, Any]:
    online = stats.online
    return {
        "variant": stats.variant,
        "stream": online.stream,
        "length": online.length,
        "lag": online.lag,
        "pending": online.pending,
        "consumers": online.consumers,
        "oldest_queued_age_s": round(online.oldest_age_s, 3),
        "bulk_length": stats.bulk.length,
        "dlq_depth": stats.dlq_depth,
    }
