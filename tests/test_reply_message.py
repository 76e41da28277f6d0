"""A worker's reply to the waiting producer carries a job's outputs as the JSON text the worker
wrote them in: neither the producer nor anyone before it parses the numbers, and the producer's
answer holds that text as it was, the same job view a parsed reply would give."""

from __future__ import annotations

import numpy as np

from shared.codec import OUTPUTS_TEXT, dumps, loads, spliced_outputs
from workers.partition.finish import Finish


def _finish(outputs: str) -> Finish:
    fields = {"outputs": outputs, "finished": "1700000000250", "queue_wait_ms": "0.412"}
    context = {"model": "minilm", "variant": "default", "created": "1700000000000"}
    return Finish(b"1-0", "job-1", "t:reply:p1", "succeeded", fields, context)


def test_outputs_travel_as_text_and_are_answered_as_written() -> None:
    outputs = dumps({"embeddings": np.float32([[0.1, -2.5e-8, 1.0]])}).decode()
    finish = _finish(outputs)
    sent = loads(dumps([loads(finish.message())]))  # as FINISH joins a micro-batch's views
    [view] = sent
    assert view[OUTPUTS_TEXT] == outputs and "outputs" not in view
    answered = dumps(spliced_outputs(view))
    assert outputs.encode() in answered
    assert loads(answered) == loads(dumps(finish.view()))


def test_a_view_without_outputs_is_left_as_it_is() -> None:
    cancelled = {"id": "job-2", "status": "cancelled", "model": "m", "variant": "v"}
    assert spliced_outputs(dict(cancelled)) == cancelled
