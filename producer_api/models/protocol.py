"""Response bodies of the models resource (OpenAI's list shape plus Conveyor's fields)."""

from __future__ import annotations

from pydantic import BaseModel


class PartitionStats(BaseModel):
    variant: str
    stream: str
    length: int
    lag: int | None
    pending: int
    consumers: int  # members of the consumer group: a killed worker's stays until pruned
    serving: int  # workers serving the partition now, by heartbeat (a killed one: within its TTL)
    warming: int  # workers loading their engines for it
    oldest_queued_age_s: float
    bulk_length: int
    dlq_depth: int


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int  # Unix seconds: when its config.yaml was last written
    owned_by: str = "conveyor"
    # vLLM's: `vllm bench serve` without `--model` reads the first card's `root`
    root: str  # the model's name: Conveyor serves no other path for it
    parent: str | None = None
    max_model_len: int | None = None  # tokens of context, where the model's config says
    kind: str
    task: str | None = None  # `embed`: served by `/v1/embeddings` too
    backend: str
    default_variant: str
    partitions: list[PartitionStats]


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]
