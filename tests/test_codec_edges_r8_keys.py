"""Stack-free: engine outputs the codec writes. A NaN or infinite dict key (a classifier's
scores keyed by threshold) was written as the key "null": the job succeeded with its keys
silently gone, and two of them read as one; a NaN in a numpy array of objects (mixed numbers
and labels) was not looked for. Each fails its own job now, as a NaN value does. A numpy array
of strings (labels picked by `labels[scores.argmax(1)]`) failed its job with "default
serializer exceeds recursion limit"; it is written as its strings, and an array JSON has no
numbers for (complex) fails saying what it holds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from shared.codec import dumps
from shared.model_repository import ModelConfig
from workers.batching.micro_batch_executor import execute
from workers.engines.base import BatchEngine

CONFIG = ModelConfig(name="outputs", kind="batch", backend="tests.unused:Given")


class Given(BatchEngine):
    """Returns each item's `output`, looked up in OUTPUTS (JSON cannot carry these in)."""

    inline = True

    def load(self) -> None:
        """Nothing to load."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [OUTPUTS[item["output"]] for item in inputs]


OUTPUTS: dict[str, Any] = {
    "null": {"by": {None: 1.0}, "scores": [None]},
    "nan-key": {"by": {0.5: 1.0, math.nan: 0.0}},
    "inf-key": {"by": [{-math.inf: 0.0}]},
    "object-array": {"scores": np.array([[0.5, "a"], [math.nan, "b"]], dtype=object)},
}


async def test_a_non_finite_key_or_number_in_an_array_of_objects_fails_its_own_job() -> None:
    outcomes = await execute(Given(CONFIG, "default", ""), [{"output": name} for name in OUTPUTS])

    assert outcomes[0].written == '{"by":{"null":1.0},"scores":[null]}'
    assert [o.error for o in outcomes[1:]] == [
        {
            "type": "InvalidOutput",
            "message": "the engine's output cannot be stored as JSON: "
            f"{where} is not a finite number (JSON has no NaN or infinity)",
        }
        for where in ("by key nan", "by[0] key -inf", "scores[1][0]")
    ]
    assert {o.batch_size for o in outcomes} == {4}  # one call: no bisection


def test_a_numpy_array_of_strings_is_written_as_its_strings() -> None:
    labels = np.array(["cat", "dog", "emu"])

    assert dumps({"labels": labels[[2, 0]], "grid": labels[:2].reshape(1, 2).T}) == (
        b'{"labels":["emu","cat"],"grid":[["cat"],["dog"]]}'
    )


def test_a_numpy_array_json_has_no_numbers_for_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="Type is not JSON serializable: complex"):
        dumps({"spectrum": np.array([1 + 2j, 3j])})
