"""An encoder's vector that is not finite (an fp16 engine's overflow) fails its own job whichever
encoding the job asked for: as base64 it was written as the float32 bytes of a NaN, which no JSON
check sees, and the job succeeded with a vector of NaNs."""

from __future__ import annotations

import numpy as np

from workers.batching.micro_batch_executor import EngineStart, succeeded
from workers.engines.text_encoding import JobSplit

NOT_FINITE = "the engine's output cannot be stored as JSON: embeddings[0][1] is not a finite number"


def test_a_vector_that_is_not_finite_fails_its_job_as_base64_too() -> None:
    vectors = np.array([[0.6, 0.8], [0.6, np.nan], [1.0, 0.0], [np.inf, 0.0]], dtype=np.float32)
    split = JobSplit(counts=[1, 1, 1, 1], base64=[True, True, False, False], tokens=[3, 3, 3, 3])
    inputs: list[dict[str, object]] = [{"texts": ["t"]}] * 4
    outcomes = succeeded(inputs, split.outputs(vectors), EngineStart.now())
    assert [o.error is None for o in outcomes] == [True, False, True, False]
    for failed in (outcomes[1], outcomes[3]):
        assert failed.output is None
        assert failed.error is not None and failed.error["type"] == "InvalidOutput"
    assert outcomes[1].error is not None
    assert outcomes[1].error["message"].startswith(NOT_FINITE)
    assert isinstance(outcomes[0].output, dict)
    assert outcomes[0].output["embeddings"] == ["mpkZP83MTD8="]  # 0.6, 0.8 as <f4 bytes
