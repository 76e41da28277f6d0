"""The scopes an API key may hold, in a module that imports nothing: `conveyor keys create`
offers them as `--scope`'s choices, and its help (and every `conveyor keys` usage error) imported
the key store, Redis and the settings only to list them."""

from typing import Literal, get_args

Scope = Literal["submit", "read", "admin"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
