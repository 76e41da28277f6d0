"""A model's input schema, compiled once (jsonschema-rs) to check every submit, and walked by
jsonschema only to explain a refusal: the two must agree on what is valid, under draft 2020-12,
and a schema that would need the network is refused when the repository loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from shared.model_repository import ModelConfig, ModelConfigError, ModelRepository
from tests.conftest import REPO_ROOT

MINILM_SCHEMA = yaml.safe_load((REPO_ROOT / "model_repository/minilm/config.yaml").read_text())[
    "input_schema"
]
# Draft 2020-12 only: `prefixItems` fixes the first items; draft 7 ignores the keyword.
PAIR_SCHEMA = {
    "type": "object",
    "properties": {
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}
    },
}

CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (MINILM_SCHEMA, {"texts": ["a sentence"]}),
    (MINILM_SCHEMA, {"texts": ["x" * 20_000]}),
    (MINILM_SCHEMA, {"texts": ["x" * 20_001]}),
    (MINILM_SCHEMA, {"texts": []}),
    (MINILM_SCHEMA, {"texts": ["ok"] * 257}),
    (MINILM_SCHEMA, {"texts": "not a list"}),
    (MINILM_SCHEMA, {"texts": ["ok", 3, None]}),
    (MINILM_SCHEMA, {"texts": ["ok"], "extra": 1}),
    (MINILM_SCHEMA, {}),
    (PAIR_SCHEMA, {"pair": ["a", 1]}),
    (PAIR_SCHEMA, {"pair": ["a", 1, {"more": True}]}),
    (PAIR_SCHEMA, {"pair": [1, "a"]}),
    (PAIR_SCHEMA, {"pair": ["a", 2**64 - 1]}),
    (PAIR_SCHEMA, {"pair": ["a", 1.5]}),
]


def _config(schema: dict[str, Any]) -> ModelConfig:
    return ModelConfig(name="m", kind="batch", backend="identity", input_schema=schema)


@pytest.mark.parametrize(("schema", "inputs"), CASES)
def test_the_compiled_check_and_the_explanation_agree(
    schema: dict[str, Any], inputs: dict[str, Any]
) -> None:
    errors = _config(schema).input_errors(inputs)
    reference = list(Draft202012Validator(schema).iter_errors(inputs))
    assert bool(errors) == bool(reference), (errors, [e.message for e in reference])
    assert len(errors) == len(reference)
    assert all(error.startswith("inputs") for error in errors)


def test_a_draft_2020_12_keyword_is_enforced() -> None:
    """Under draft 7, which some compiled validators implement, `prefixItems` would pass all."""
    assert _config(PAIR_SCHEMA).input_errors({"pair": [1, "a"]}) == [
        "inputs['pair'][0]: 1 is not of type 'string'",
        "inputs['pair'][1]: 'a' is not of type 'integer'",
    ]


def test_what_the_compiled_check_refuses_is_refused_when_the_explanation_finds_nothing() -> None:
    """ECMA-262's `$` (the compiled check's) ends the string; Python's also matches before a
    final newline, so the explanation found no error and the input went through."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}
    assert not list(Draft202012Validator(schema).iter_errors({"id": "abc\n"}))
    assert _config(schema).input_errors({"id": "abc\n"}) == [
        "inputs: does not match the model's input_schema"
    ]
    assert _config(schema).input_errors({"id": "abc"}) == []


def test_a_schema_with_a_remote_ref_is_refused_at_load_without_fetching(tmp_path: Path) -> None:
    model = tmp_path / "remote"
    model.mkdir()
    schema = {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/schema.json"}}}
    config = {"kind": "batch", "backend": "identity", "input_schema": schema}
    (model / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ModelConfigError, match=r"remote \$ref 'http://127.0.0.1:9/schema.json'"):
        ModelRepository.load(tmp_path)
