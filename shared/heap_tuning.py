"""The garbage collector's settings for a long-running server process, applied once start-up is
done. CPython's cyclic collector is tuned for scripts: a young collection every 700 net
allocations, and a full one whenever the objects that survived young collections grow by a
quarter of the old generation. A busy producer holds every in-flight request's objects alive
across many young collections, so those survivors pile into the old generation and trigger
full collections of everything start-up built (FastAPI, pydantic, the schemas: some 160,000
objects) about twice a second at concurrency 32, each stopping the event loop for up to a tenth
of a second.

`gc.freeze()` moves what start-up built into the permanent generation, which no collection
scans again, and a higher young-generation threshold lets short-lived request objects die by
reference counting before a collection promotes them."""

from __future__ import annotations

import gc

from shared.settings import Settings


def settle_heap(settings: Settings) -> None:
    """Call once the process has built what it keeps for its lifetime (routes, engines,
    clients), right before it starts serving."""
    gc.collect()  # what start-up left as garbage is freed, not frozen
    if settings.gc_freeze:
        gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(settings.gc_young_threshold, older, oldest)
