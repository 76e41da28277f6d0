"""The operator console at `/console`: live partitions, workers, jobs, batches, dead letters and
routes in the browser, for keys with the `read` scope (admin sees every tenant and may act)."""

from producer_api.console.api_router import router
from producer_api.console.headers import ConsoleHeadersMiddleware
from producer_api.console.service import Console

__all__ = ["Console", "ConsoleHeadersMiddleware", "router"]
