"""Who may call the producer: API keys, scopes, tenants and per-key quotas.

A route opts in with one dependency, which authenticates the key, takes a rate-limit token
(the request boundary does both before the body is read), checks the scope and hands the route
the caller's `Principal`:

    from producer_api.auth import Principal, require

    @router.get("/v1/things/{id}")
    async def get_thing(principal: Annotated[Principal, Depends(require("read"))]) -> ...:
        ...  # principal.tenant owns what this route may show

A resource's routes usually take their service ready-made for the caller instead:
`Annotated[JobsService, Depends(acting_for("read", JobsService))]`.

`/healthz`, `/readyz` and `/metrics` stay open; everything else names a scope.
"""

from producer_api.auth.dependencies import AUTH_RESPONSES, acting_for, require
from producer_api.auth.principal import ANONYMOUS, Principal

__all__ = ["ANONYMOUS", "AUTH_RESPONSES", "Principal", "acting_for", "require"]
