"""Request and response bodies of the routes resource."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from shared.routing import StickyBy


class RoutesBody(BaseModel):
    """A model's new routes: every serving variant's percent (summing to 100), shadow variants
    with the share of online requests copied to them, and what keeps a user on its variant.
    Finite numbers only, refused by pydantic's own message ("Infinity" is otherwise inf), and
    strict ones: lax mode read `true` as a weight of 1 and `"3"` as version 3."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    weights: dict[str, float]
    shadows: dict[str, float] = Field(default_factory=dict)
    sticky_by: StickyBy = "routing_key"
    expected_version: int | None = Field(
        default=None, ge=0, description="Refuse (409) unless the routes are still at this version"
    )


class RouteChange(BaseModel):
    version: int
    at: float
    by: str
    old: dict[str, object] | None
    new: dict[str, object]


class RoutesView(BaseModel):
    """The routes producers serve: the stored ones, as they fit the model's config.yaml now."""

    model: str
    version: int
    weights: dict[str, float]
    shadows: dict[str, float]
    sticky_by: StickyBy
    adjusted: str | None = Field(
        default=None,
        description="Why the routes shown differ from the stored ones (the history's last "
        "`new`): variants config.yaml no longer has were dropped (they had no weight), or the "
        "stored routes cannot serve and config.yaml's apply; null when served as stored",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="One per variant the routes send jobs to (weight or shadow sampling) that no"
        " worker serves or warms up now, by heartbeat: its jobs wait in its queue",
    )
    history: list[RouteChange]
