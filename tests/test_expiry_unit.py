"""Stack-free: how a partition decides an entry must not run (already ended, gone) or has
expired (past its deadline, or queued longer than `max_queue_time_s`), and what its result
carries."""

from __future__ import annotations

import pytest

from shared.codec import RequestEntry, loads
from shared.job_states import JobStatus
from shared.keys import Keys
from shared.model_repository import ModelConfig, QueueLimits
from workers.partition.partition import Partition
from workers.partition.stream_reader import Delivery

CLAIMED_MS = 1_000_000


@pytest.fixture
def partition() -> Partition:
    config = ModelConfig(
        name="m", kind="batch", backend="identity", queue=QueueLimits(max_queue_time_s=10)
    )
    return Partition.of(Keys(), config, "default")


def _delivery(
    status: str = "running", enqueued_ms: int = CLAIMED_MS - 1, deadline_ms: int = 0
) -> Delivery:
    request = RequestEntry(
        job_id="j1", payload={"inputs": {}}, enqueued_ms=enqueued_ms, deadline_ms=deadline_ms
    )
    request.reply = "r1"
    return Delivery(b"1-0", request, status, CLAIMED_MS)


def test_a_fresh_running_entry_runs(partition: Partition) -> None:
    assert partition.skip_or_expire(_delivery()) is None


def test_a_deadline_in_the_future_runs(partition: Partition) -> None:
    assert partition.skip_or_expire(_delivery(deadline_ms=CLAIMED_MS + 1)) is None


@pytest.mark.parametrize("status", ["succeeded", "cancelled", "failed", "missing"])
def test_an_entry_whose_job_is_not_running_is_only_acknowledged(
    partition: Partition, status: str
) -> None:
    finish = partition.skip_or_expire(_delivery(status))
    assert finish is not None
    assert (finish.entry_id, finish.status, finish.job_id, finish.fields) == (b"1-0", "", "", {})


def test_an_undecodable_entry_is_only_acknowledged(partition: Partition) -> None:
    finish = partition.skip_or_expire(Delivery(b"2-0", None, "running", CLAIMED_MS))
    assert finish is not None and finish.entry_id == b"2-0" and finish.status == ""


def test_past_its_deadline_the_job_expires(partition: Partition) -> None:
    finish = partition.skip_or_expire(_delivery(deadline_ms=CLAIMED_MS - 1))
    assert finish is not None and finish.status == JobStatus.EXPIRED
    assert loads(finish.fields["error"])["type"] == "DeadlineExceeded"
    assert finish.job_id == "j1" and finish.reply == "r1"


def test_queued_longer_than_max_queue_time_the_job_expires(partition: Partition) -> None:
    assert partition.skip_or_expire(_delivery(enqueued_ms=CLAIMED_MS - 10_000)) is None
    finish = partition.skip_or_expire(_delivery(enqueued_ms=CLAIMED_MS - 10_001))
    assert finish is not None and finish.status == JobStatus.EXPIRED
    assert finish.fields["queue_wait_ms"] == "10001"


def test_a_job_run_again_after_its_worker_died_is_not_expired_by_max_queue_time(
    partition: Partition,
) -> None:
    """Its time since enqueue holds its first run and the visibility timeout: it ended
    `expired`, "before it could run", though it had run; its deadline still bounds it."""
    again = _delivery(enqueued_ms=CLAIMED_MS - 10_001)
    again.redelivered, again.attempts = True, 2
    assert partition.skip_or_expire(again) is None
    late = _delivery(enqueued_ms=CLAIMED_MS - 10_001, deadline_ms=CLAIMED_MS - 1)
    late.redelivered, late.attempts = True, 2
    finish = partition.skip_or_expire(late)
    assert finish is not None and finish.status == JobStatus.EXPIRED


def test_a_batch_item_waits_out_its_window_not_max_queue_time(partition: Partition) -> None:
    """A Batch API item carries its window as its deadline; it expired after the queue's
    `max_queue_time_s` (600 s by default), though its batch had 24 h to run."""
    item = _delivery(enqueued_ms=CLAIMED_MS - 10_001, deadline_ms=CLAIMED_MS + 1)
    assert item.entry is not None
    item.entry.batch = "batch_1"
    assert partition.skip_or_expire(item) is None
    late = _delivery(enqueued_ms=CLAIMED_MS - 10_001, deadline_ms=CLAIMED_MS - 1)
    assert late.entry is not None
    late.entry.batch = "batch_1"
    finish = partition.skip_or_expire(late)
    assert finish is not None and finish.status == JobStatus.EXPIRED


def test_an_entry_says_which_batch_it_belongs_to() -> None:
    entry = RequestEntry("j1", {"inputs": {}}, 1.0, batch="batch_1")
    encoded = {k.encode(): str(v).encode() for k, v in entry.encode().items()}
    encoded[b"payload"] = b"{}"
    assert RequestEntry.decode(encoded).batch == "batch_1"
    assert "batch" not in RequestEntry("j2", {}, 1.0).encode()


def test_a_result_carries_timing_context_and_webhook(partition: Partition) -> None:
    delivery = _delivery(enqueued_ms=CLAIMED_MS - 250)
    assert delivery.entry is not None
    delivery.entry.payload["webhook"] = "https://hooks.example/x"
    finish = partition.finish(delivery, JobStatus.SUCCEEDED, {"outputs": "{}"})
    assert finish.fields["queue_wait_ms"] == "250" and "finished" in finish.fields
    assert finish.context == {
        "model": "m",
        "variant": "default",
        "created": str(CLAIMED_MS - 250),
        "started": str(CLAIMED_MS),
    }
    assert finish.webhook == "https://hooks.example/x"


def test_the_queue_wait_ends_when_the_engine_started_on_the_job(partition: Partition) -> None:
    """A staged engine's micro-batch may wait for the device after the read: that is queue wait
    too, while the attempt began at the read."""
    delivery = _delivery(enqueued_ms=CLAIMED_MS - 250)
    finish = partition.finish(delivery, JobStatus.SUCCEEDED, {}, ran_ms=CLAIMED_MS + 40)
    assert finish.fields["queue_wait_ms"] == "290"
    assert finish.fields["started"] == str(CLAIMED_MS)


def test_a_job_read_in_the_ms_it_came_waited_no_time(partition: Partition) -> None:
    """The read is stamped to the whole ms, the enqueue to the µs: its wait read -0.247."""
    finish = partition.finish(_delivery(enqueued_ms=CLAIMED_MS + 0.247), JobStatus.SUCCEEDED, {})
    assert finish.fields["queue_wait_ms"] == "0"
