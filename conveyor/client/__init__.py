"""`conveyor.client`: the Python SDK. `Client` (blocking) and `AsyncClient` (asyncio) share one
implementation of every operation; both read `CONVEYOR_URL` and `CONVEYOR_API_KEY`.

    from conveyor.client import Client

    with Client() as client:
        job = client.predict("minilm", {"texts": ["hello"]})
        batch = client.batches.create("prompts.jsonl", model="minilm")
        client.batches.wait(batch.id, progress=lambda b: print(b.counts))
        results = client.batches.results(batch.id)

The SDK loads on first use of one of its names (PEP 562): a `conveyor` command imports
`conveyor.client.cli_options` for its options, and `--help` must not wait for httpx and pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.client.async_client import AsyncBatches, AsyncClient, AsyncFiles
    from conveyor.client.errors import (
        APIConnectionError,
        APIError,
        APITimeoutError,
        AuthError,
        Conflict,
        ConveyorError,
        InvalidArgument,
        NotFound,
        RateLimited,
        StreamError,
        StreamFailed,
        Unavailable,
        WaitTimeout,
    )
    from conveyor.client.retries import RetryEvent, RetryPolicy
    from conveyor.client.sync_client import Batches, Client, Files
    from conveyor.client.types import (
        Attempt,
        Batch,
        BatchCounts,
        BatchError,
        BatchList,
        BatchOutput,
        BatchResults,
        ChatCompletion,
        ChatCompletionChunk,
        EmbeddingList,
        Event,
        FileDeleted,
        FileList,
        FileObject,
        Job,
    )

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AsyncBatches",
    "AsyncClient",
    "AsyncFiles",
    "Attempt",
    "AuthError",
    "Batch",
    "BatchCounts",
    "BatchError",
    "BatchList",
    "BatchOutput",
    "BatchResults",
    "Batches",
    "ChatCompletion",
    "ChatCompletionChunk",
    "Client",
    "Conflict",
    "ConveyorError",
    "EmbeddingList",
    "Event",
    "FileDeleted",
    "FileList",
    "FileObject",
    "Files",
    "InvalidArgument",
    "Job",
    "NotFound",
    "RateLimited",
    "RetryEvent",
    "RetryPolicy",
    "StreamError",
    "StreamFailed",
    "Unavailable",
    "WaitTimeout",
]

# The modules that define the names above (`__all__`), as the imports under TYPE_CHECKING say.
_MODULES = ("async_client", "errors", "retries", "sync_client", "types")


def __getattr__(name: str) -> object:
    """One of `__all__`, imported the first time it is asked for."""
    if name in __all__:
        for module in _MODULES:
            found = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
            if found is not None:
                globals()[name] = found
                return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
