"""The authenticated caller as routes and services see it: a tenant that owns its jobs, the
scopes and models its key allows, and the quota its requests are counted against."""

from __future__ import annotations

from dataclasses import dataclass

from shared.api_keys import SCOPES, ApiKey
from shared.rate_limit import Quota
from shared.settings import Settings


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    scopes: frozenset[str]
    models: frozenset[str]
    key_id: str
    quota: Quota | None
    weight: float = 1.0  # the tenant's share in fair queuing
    # the key whose limit buckets it shares: a rotated key's first key, so a rotation does not
    # double a tenant's capacity; `key_id` stays the key's own (key watch, console sessions,
    # audit text). Empty: its own.
    limits_of: str = ""

    @property
    def limits_id(self) -> str:
        """The id its rate bucket, in-flight set and open-streams set are named after."""
        return self.limits_of or self.key_id

    def may(self, scope: str) -> bool:
        """`admin` includes `submit` and `read`."""
        return scope in self.scopes or "admin" in self.scopes

    def may_use(self, model: str) -> bool:
        return not self.models or model in self.models

    @classmethod
    def of(cls, key: ApiKey, settings: Settings) -> Principal:
        spec = key.spec
        quota = Quota(
            rate_per_s=spec.rate_per_s or settings.rate_limit_per_s,
            burst=spec.burst or settings.rate_limit_burst,
            max_in_flight=spec.max_in_flight or settings.max_in_flight,
            max_streams=spec.max_streams or settings.max_streams_per_key,
        )
        return cls(
            spec.tenant, spec.scopes, spec.models, key.key_id, quota, spec.weight, key.limits_of
        )


# Every caller when CONVEYOR_AUTH=disabled: one tenant, every scope, no quota.
ANONYMOUS = Principal("default", frozenset(SCOPES), frozenset(), "anonymous", None)
