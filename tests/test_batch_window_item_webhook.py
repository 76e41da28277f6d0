"""A Batch API item a worker reads past its batch's window is expired by the worker itself
(items carry the window's end as their deadline), and its result went out to the item's own
webhook as `job.expired`, where the README promises no item webhook for the items the batch's
expiry ends (the batch's webhook reports them; its errors file says `batch_expired`). An item
whose line set its own, earlier deadline still notifies its webhook when that passes."""

from __future__ import annotations

import pytest

from shared.codec import RequestEntry
from shared.keys import Keys
from shared.model_repository import ModelConfig
from workers.partition.partition import Partition
from workers.partition.stream_reader import Delivery

CONFIG = ModelConfig(name="m", kind="batch", backend="identity")
PARTITION = Partition.of(Keys("batch-window-webhook:"), CONFIG, "default")
WINDOW_END = 10_000
HOOK = "https://hooks.example.com/items"


def _item(deadline_ms: int) -> RequestEntry:
    """An item as the producer enqueues it, read back from its stream entry."""
    entry = RequestEntry("item-1", {"inputs": {}, "webhook": HOOK}, 1_000.0)
    entry.batch, entry.batch_until, entry.deadline_ms = "batch_x", WINDOW_END, deadline_ms
    written = entry.encode().items()
    fields = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in written}
    return RequestEntry.decode(fields)


@pytest.mark.parametrize(
    ("deadline_ms", "webhook"),
    [(WINDOW_END, ""), (WINDOW_END - 5_000, HOOK)],
    ids=["the-window-ended", "its-own-deadline-passed"],
)
def test_an_item_the_window_expired_notifies_no_item_webhook(
    deadline_ms: int, webhook: str
) -> None:
    delivery = Delivery(b"1-0", _item(deadline_ms), "queued", WINDOW_END + 1)
    expired = PARTITION.skip_or_expire(delivery)
    assert expired is not None and expired.status == "expired"
    assert expired.webhook == webhook
