"""`conveyor.client`: the Python SDK. `Client` (blocking) and `AsyncClient` (asyncio) share one
implementation of every operation; both read `CONVEYOR_URL` and `CONVEYOR_API_KEY`.

    from conveyor.client import Client

    with Client() as client:
        job = client.predict("minilm", {"texts": ["hello"]})
        batch = client.batches.create("prompts.jsonl", model="minilm")
        client.batches.wait(batch.id, progress=lambda b: print(b.counts))
        results = client.batches.results(batch.id)
"""

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
