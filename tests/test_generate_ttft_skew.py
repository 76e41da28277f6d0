"""A generation's time to first token when the producer's clock runs ahead of the worker's."""

from __future__ import annotations

from shared.codec import RequestEntry
from shared.job_states import JobStatus
from workers.engines.base import GenerateRequest, TokenChunk
from workers.generation.generate_job import RunningJob
from workers.partition.stream_reader import Delivery


def _ttft(submitted_ms: int, first_token_ms: int) -> float | None:
    entry = RequestEntry("skewed", {"prompt": "Say"}, submitted_ms)
    delivery = Delivery(b"1-0", entry, JobStatus.RUNNING.value, 0)
    job = RunningJob(delivery, "lane", GenerateRequest("skewed"), redelivered=False)
    job.take(TokenChunk("Yes", 1, None, prompt_tokens=2, completion_tokens=1), first_token_ms, 1)
    return job.ttft_ms


def test_a_producer_clock_ahead_gives_no_negative_time_to_first_token() -> None:
    """Submitted at 10.0 s by the producer's clock, first token at 9.5 s by the worker's: -500
    ms went into the job's `ttft_ms` and the TTFT histogram's sum, which then went down."""
    assert _ttft(10_000, 9_500) == 0
    assert _ttft(10_000, 10_250) == 250
