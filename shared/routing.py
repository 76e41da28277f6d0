"""Which variant serves a request: the explicit one, else a weighted split that is sticky per
routing key (a hash of, say, the user id) so one user stays on one variant."""

from __future__ import annotations

import hashlib
import random

from shared.model_repository import ModelConfig


class UnknownVariant(LookupError):
    pass


def choose_variant(config: ModelConfig, explicit: str | None, routing_key: str | None) -> str:
    if explicit is not None:
        if explicit not in config.variants:
            raise UnknownVariant(f"model {config.name} has no variant {explicit!r}")
        return explicit
    weighted = [(n, v.weight) for n, v in config.variants.items() if v.weight > 0 and not v.shadow]
    total = sum(weight for _, weight in weighted)
    if total == 0:
        return config.default_variant
    point = _bucket(routing_key, total)
    for name, weight in weighted:
        if point < weight:
            return name
        point -= weight
    return config.default_variant


def _bucket(routing_key: str | None, total: int) -> int:
    if routing_key is None:
        return random.randrange(total)
    digest = hashlib.blake2b(routing_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % total
