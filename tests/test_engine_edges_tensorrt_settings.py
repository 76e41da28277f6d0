"""TensorRT's settings are checked before its GPU packages are imported, so a bad one is named
on any machine: `engine_cache_dir` was read only after them, and a number or a list there failed
the load on a GPU with `Path()`'s TypeError, which named no setting."""

from __future__ import annotations

from typing import Any

import pytest

from tests.minilm_reference import minilm_config
from workers.engines.tensorrt_engine import TensorRTEngine


@pytest.mark.parametrize("cache_dir", [5, ["plans"], True])
def test_an_engine_cache_dir_that_is_no_path_is_refused_by_name(cache_dir: Any) -> None:
    config = minilm_config()
    parameters = {**config.parameters, "engine_cache_dir": cache_dir}
    config = config.model_copy(update={"backend": "tensorrt", "parameters": parameters})
    engine = TensorRTEngine(config, "default", "unused")
    with pytest.raises(ValueError, match=r"^parameters.engine_cache_dir must be a path, not "):
        engine.load()
