"""The models resource: each model of the repository with its partitions' queue state, and
which model a caller may act on."""

from __future__ import annotations

from typing import Any

from producer_api.auth.principal import Principal
from producer_api.errors import ConveyorError, unknown_model
from producer_api.state import ProducerState
from shared.model_repository import ModelConfig, ModelRepository
from shared.partition_stats import PartitionStats, read_partition_stats
from shared.queue_position import PartitionLoad, read_partition_loads


def model_of(state: ProducerState, principal: Principal, model: str) -> ModelConfig:
    """The model a route acts on: 404 when unknown, 403 when the key may not use it."""
    config = state.repository.get(model)
    if config is None:
        raise unknown_model(model)
    if not principal.may_use(model):
        raise ConveyorError(403, "forbidden", f"this API key may not use model {model!r}")
    return config


class ModelsService:
    def __init__(self, state: ProducerState) -> None:
        self.state = state

    async def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": await self._cards(self.state.repository)}

    async def get_model(self, config: ModelConfig) -> dict[str, Any]:
        """One model's card, only its own partitions read."""
        [card] = await self._cards(ModelRepository({config.name: config}))
        return card

    async def _cards(self, repository: ModelRepository) -> list[dict[str, Any]]:
        state = self.state
        stats = await read_partition_stats(state.redis, state.keys, repository)
        loads = await _workers(state, [(p.model, p.variant) for p in stats])
        cards: dict[str, dict[str, Any]] = {
            config.name: {
                "id": config.name,
                "object": "model",
                "created": _created(config),
                "owned_by": "conveyor",
                "root": config.name,
                "parent": None,
                "max_model_len": _max_model_len(config),
                "kind": config.kind,
                "task": config.task,
                "backend": config.backend,
                "default_variant": config.default_variant,
                "partitions": [],
            }
            for config in repository
        }
        for partition in stats:
            load = loads[(partition.model, partition.variant)]
            cards[partition.model]["partitions"].append(_partition(partition, load))
        return list(cards.values())


async def _workers(
    state: ProducerState, partitions: list[tuple[str, str]]
) -> dict[tuple[str, str], PartitionLoad]:
    """Each partition's workers by heartbeat, as a job's `scaling` event counts them: a consumer
    group keeps a killed worker as a member until another worker of its partition prunes it,
    and its only one never is (`consumers` 1 for good, with nothing serving). No drain rates."""
    no_rates = [(0.0, 0.0)] * len(partitions)
    return await read_partition_loads(state.redis, state.keys, partitions, no_rates)


def _created(config: ModelConfig) -> int:
    """OpenAI's `created` (strict clients require it): when the model's config.yaml was last
    written, in Unix seconds; 0 for a config not read from a file."""
    try:
        return int((config.directory / "config.yaml").stat().st_mtime)
    except OSError:
        return 0


def _max_model_len(config: ModelConfig) -> int | None:
    """vLLM's `max_model_len` (tokens of context) of the default variant, as its server's card
    says it: a vLLM engine's own argument, else an encoder's `max_seq_length` (what it cuts a
    text to); None where the config says neither (the engine's default, unknown here)."""
    parameters = {**config.parameters, **config.variants[config.default_variant].parameters}
    for name in ("max_model_len", "max_seq_length"):
        value = parameters.get(name)
        if type(value) is int:
            return value
    return None


def _partition(stats: PartitionStats, load: PartitionLoad) -> dict[str, Any]:
    online = stats.online
    return {
        "variant": stats.variant,
        "stream": online.stream,
        "length": online.length,
        "lag": online.lag,
        "pending": online.pending,
        "consumers": online.consumers,
        "serving": load.serving,
        "warming": load.warming,
        "oldest_queued_age_s": round(online.oldest_age_s, 3),
        "bulk_length": stats.bulk.length,
        "dlq_depth": stats.dlq_depth,
    }
