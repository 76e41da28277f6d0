"""Stack-free: which variant serves a request (an explicit one, else by weight, the same one
for the same routing key)."""

from __future__ import annotations

from collections import Counter

import pytest

from shared.model_repository import ModelConfig, Variant
from shared.routing import UnknownVariant, choose_variant


def _config(**weights: int) -> ModelConfig:
    variants = {name: Variant(weight=weight) for name, weight in weights.items()}
    return ModelConfig(name="m", kind="batch", backend="identity", variants=variants)


def test_an_explicit_variant_wins_even_at_zero_weight() -> None:
    assert choose_variant(_config(default=100, canary=0), "canary", "user-1") == "canary"


def test_an_unknown_explicit_variant_is_refused() -> None:
    with pytest.raises(UnknownVariant):
        choose_variant(_config(default=100), "nope", None)


def test_a_zero_weight_variant_gets_no_traffic() -> None:
    config = _config(default=100, canary=0)
    assert {choose_variant(config, None, f"user-{i}") for i in range(200)} == {"default"}


def test_the_same_routing_key_always_gets_the_same_variant() -> None:
    config = _config(default=50, canary=50)
    for i in range(50):
        first = choose_variant(config, None, f"user-{i}")
        assert all(choose_variant(config, None, f"user-{i}") == first for _ in range(5))


def test_keys_split_by_weight() -> None:
    config = _config(default=80, canary=20)
    counts = Counter(choose_variant(config, None, f"user-{i}") for i in range(4000))
    assert counts["canary"] / 4000 == pytest.approx(0.2, abs=0.03)


def test_an_empty_key_is_no_key() -> None:
    """An empty `routing_key` (or OpenAI `user`) was a sticky key like any other: every request
    sending "" went to the one variant it hashed to. It is split at random by weight, as no key
    is (5 000 draws: a share more than 4 points off is over 6 standard deviations away)."""
    weights = {"default": 70, "b": 20, "c": 10}
    counts = Counter(choose_variant(_config(**weights), None, "") for _ in range(5000))
    for name, weight in weights.items():
        assert counts[name] / 5000 == pytest.approx(weight / 100, abs=0.04), counts
