"""A generate model's token counts are bounded where floats hold them: shared/backlog.py turns a
job's unmeasured tokens into a float, and a `default_max_tokens` past ~1.8e308 loaded, then
raised OverflowError wherever the partition's backlog was read (KEDA's metric, the console)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.backlog import backlog_of
from shared.model_repository import MAX_TOKENS, ModelConfigError, ModelRepository

GENERATE = "kind: generate\nbackend: vllm\n"


def _load(root: Path, parameters: str) -> ModelRepository:
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(f"{GENERATE}parameters: {parameters}\n")
    return ModelRepository.load(root)


@pytest.mark.parametrize("field", ["default_max_tokens", "max_tokens_limit"])
def test_a_token_count_no_float_holds_is_refused(tmp_path: Path, field: str) -> None:
    with pytest.raises(ModelConfigError) as refused:
        _load(tmp_path, f"{{{field}: {10**400}}}")
    assert str(refused.value) == (
        f"{tmp_path / 'm' / 'config.yaml'}: model m variant default: parameters.{field}: "
        f"Input should be less than or equal to {MAX_TOKENS}"
    )


def test_the_bound_itself_is_estimated_exactly(tmp_path: Path) -> None:
    config = _load(tmp_path, f"{{default_max_tokens: {MAX_TOKENS}}}").models["m"]
    assert backlog_of(config, "default", 1, {}).units_per_job == MAX_TOKENS
