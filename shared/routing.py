"""Which variant serves a request: the explicit one, else the model's live routes (weights that
sum to 100) picked by weighted rendezvous hashing over (sticky key, model, variant), so one user
stays on one variant and a weight change moves only the minimum share of users, all of them
towards the variant that gained weight."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.model_repository import ModelConfig, quote

StickyBy = Literal["routing_key", "tenant"]
WEIGHT_TOTAL = 100.0
_TOLERANCE = 1e-6
_SCALE = float(2**64)
_BELOW_ONE = math.nextafter(1.0, 0.0)


class UnknownVariant(LookupError):
    pass


class InvalidRoutes(ValueError):
    """Routes that cannot serve the model (weights that don't sum, negative rates...)."""


@dataclass(frozen=True, slots=True)
class Routes:
    """A model's live split: primary weights (percent, summing to 100), shadow variants with
    the share of online requests copied to them, and what stickiness is keyed by."""

    weights: dict[str, float]
    shadows: dict[str, float] = field(default_factory=dict)
    sticky_by: StickyBy = "routing_key"
    version: int = 0

    def __post_init__(self) -> None:
        """Every weight and rate unsigned at 0: `-0.0 < 0` is False, so a body's -0.0 (or a
        step scaling one) passed the check and was stored, served and gauged as -0."""
        object.__setattr__(self, "weights", _unsigned(self.weights))
        object.__setattr__(self, "shadows", _unsigned(self.shadows))

    def document(self) -> dict[str, Any]:
        """The stored and served shape (the version travels beside it)."""
        return {"weights": self.weights, "shadows": self.shadows, "sticky_by": self.sticky_by}

    @classmethod
    def of(cls, document: dict[str, Any], version: int = 0) -> Routes:
        return cls(
            weights={k: float(v) for k, v in document.get("weights", {}).items()},
            shadows={k: float(v) for k, v in document.get("shadows", {}).items()},
            sticky_by=document.get("sticky_by", "routing_key"),
            version=version,
        )

    def check(self, config: ModelConfig) -> None:
        """Raise UnknownVariant or InvalidRoutes unless these routes can serve `config`."""
        for name in [*self.weights, *self.shadows]:
            known_variant(config, name)
        for name, weight in self.weights.items():
            if weight > 0:
                serving_variant(config, name)
        if any(not math.isfinite(w) or w < 0 for w in self.weights.values()):
            raise InvalidRoutes("weights must be finite and not negative")
        total = sum(self.weights.values())
        if abs(total - WEIGHT_TOTAL) > _TOLERANCE:
            # 10 digits: `:g`'s 6 printed a third each (33.33333) as "must sum to 100, not 100"
            raise InvalidRoutes(f"weights must sum to 100, not {total:.10g}")
        for name, rate in self.shadows.items():
            if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
                raise InvalidRoutes(f"shadow {name}: sample rate must lie in [0, 1], not {rate}")
            if self.weights.get(name, 0.0) > 0:
                raise InvalidRoutes(f"variant {name} cannot both serve and shadow")
        if self.sticky_by not in ("routing_key", "tenant"):
            raise InvalidRoutes("sticky_by must be `routing_key` or `tenant`")

    def without_removed(self, config: ModelConfig) -> tuple[Routes, list[str]]:
        """These routes without the variants `config` no longer has, and their names: removing a
        variant nobody is routed to from config.yaml must not move any traffic. Raise
        UnknownVariant if a removed one carries weight: its share has nowhere to go."""
        removed = [n for n in {**self.weights, **self.shadows} if n not in config.variants]
        for name in removed:
            if self.weights.get(name, 0.0) != 0:
                weight = self.weights[name]
                raise UnknownVariant(f"model {config.name} has no variant {name!r} ({weight:g} %)")
        weights = {k: w for k, w in self.weights.items() if k in config.variants}
        shadows = {k: r for k, r in self.shadows.items() if k in config.variants}
        return Routes(weights, shadows, self.sticky_by, self.version), removed

    def with_share(self, variant: str, percent: float, held: Mapping[str, float]) -> Routes:
        """The same routes with `variant` at `percent`, the other primaries scaled so their
        ratios hold; once they have no weight left (the variant took everything), the ratios
        `held` they had before: a canary step or rollback. A variant given traffic stops being
        a shadow (no variant both serves and shadows): the canary's own, and one `held` gives
        its share back to (a rollback from 100 % left the old baseline an operator shadowed
        meanwhile serving and shadowing, routes no producer serves)."""
        others = {k: w for k, w in self.weights.items() if k != variant}
        if sum(others.values()) <= 0:
            others |= {k: w for k, w in held.items() if k != variant}
        rest = sum(others.values())
        left = WEIGHT_TOTAL - percent
        if rest <= 0 < left:
            raise InvalidRoutes(f"no variant besides {variant} to take {left:g} % of traffic")
        scaled = {k: w * left / rest if rest > 0 else 0.0 for k, w in others.items()}
        weights = {**scaled, variant: percent}
        shadows = {k: r for k, r in self.shadows.items() if weights.get(k, 0.0) <= 0}
        return Routes(weights, shadows, self.sticky_by, self.version)

    def fed(self) -> list[str]:
        """The variants these routes send jobs to: those with weight, and sampling shadows."""
        served = [name for name, weight in self.weights.items() if weight > 0]
        return served + [name for name, rate in self.shadows.items() if rate > 0]

    def served_besides(self, variant: str) -> dict[str, float]:
        """The primaries other than `variant` that have traffic, with their weights."""
        return {k: w for k, w in self.weights.items() if k != variant and w > 0}


def _unsigned(shares: Mapping[str, float]) -> dict[str, float]:
    return {name: 0.0 if share == 0 else share for name, share in shares.items()}


def known_variant(config: ModelConfig, name: str) -> None:
    """Raise UnknownVariant unless `config` has the variant, its name quoted cut short (a body
    may name any string: a 100 KB one was quoted whole in the 422)."""
    if name not in config.variants:
        raise UnknownVariant(f"model {config.name} has no variant {quote(name)}")


def serving_variant(config: ModelConfig, name: str) -> None:
    """Raise UnknownVariant or InvalidRoutes unless the variant may take live traffic: one
    config.yaml marks `shadow: true` only takes copies (a SageMaker shadow variant, an Istio
    mirror), so weight on it, from routes or a canary, is a mistake."""
    known_variant(config, name)
    if config.variants[name].shadow:
        raise InvalidRoutes(
            f"variant {name} of model {config.name} is a shadow (`shadow: true` in config.yaml):"
            " it takes copies of requests, never live traffic"
        )


def seed_routes(config: ModelConfig) -> Routes:
    """The routes config.yaml describes: primary weights normalised to percent (the default
    variant takes everything when none has weight), shadows at their sample rate."""
    primaries = {n: float(v.weight) for n, v in config.variants.items() if not v.shadow}
    total = sum(primaries.values())
    if total > 0:
        weights = {n: w * WEIGHT_TOTAL / total for n, w in primaries.items()}
    else:
        weights = {n: WEIGHT_TOTAL if n == config.default_variant else 0.0 for n in primaries}
    shadows = {n: v.sample_rate for n, v in config.variants.items() if v.shadow}
    return Routes(weights, shadows)


def served_routes(stored: Routes, config: ModelConfig) -> tuple[Routes, str | None]:
    """The routes producers serve `config` with, given its stored ones, and why they differ (None
    when they don't): variants config.yaml no longer has are dropped while they carry no weight;
    routes that still cannot serve give way to config.yaml's (at the stored version, which is
    what a change must name) until someone fixes them."""
    try:
        routes, removed = stored.without_removed(config)
        routes.check(config)
    except (UnknownVariant, InvalidRoutes) as exc:
        seeded = dataclasses.replace(seed_routes(config), version=stored.version)
        return seeded, f"stored routes ignored, config.yaml's apply: {exc}"
    if removed:
        names = ", ".join(map(repr, removed))
        return routes, f"dropped {names}: no weight and no longer in config.yaml"
    return routes, None


def choose_variant(
    config: ModelConfig, explicit: str | None, sticky_key: str | None, routes: Routes | None = None
) -> str:
    if explicit is not None:
        if explicit not in config.variants:
            raise UnknownVariant(f"model {config.name} has no variant {explicit!r}")
        return explicit
    weights = (routes or seed_routes(config)).weights
    candidates = [(name, w) for name, w in weights.items() if w > 0]
    if not candidates:
        return config.default_variant
    if len(candidates) == 1:  # the usual case: one variant takes everything
        return candidates[0][0]
    if not sticky_key:  # an empty key ("" routing_key or user) is no key: it would pin them all
        names, shares = zip(*candidates, strict=True)
        return random.choices(names, shares)[0]
    return max(candidates, key=lambda c: _score(sticky_key, config.name, c[0], c[1]))[0]


def _score(key: str, model: str, variant: str, weight: float) -> float:
    """Weighted rendezvous score: -w / ln(u), u uniform in (0, 1) from a hash. The variant with
    the highest score wins with probability w / sum(w); raising one weight (others scaled) only
    moves keys to it."""
    digest = hashlib.blake2b(f"{model}\0{variant}\0{key}".encode(), digest_size=8).digest()
    return -weight / math.log(_unit(digest))


def _unit(digest: bytes) -> float:
    """The digest as u in (0, 1). Below 1 even for the top 1 024 of 2^64, which a float rounds
    to 1.0, whose ln of 0 failed every request of their key; every other u is unchanged, so no
    user moves."""
    return min((int.from_bytes(digest, "big") + 0.5) / _SCALE, _BELOW_ONE)
