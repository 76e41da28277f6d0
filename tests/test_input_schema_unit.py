"""A model's input schema, compiled once (jsonschema-rs) to check every submit and explain a
refusal: it must agree with jsonschema's reading of draft 2020-12, take ECMA-262 patterns, and
a schema that would need the network is refused when the repository loads."""

from __future__ import annotations

import subprocess
import sys
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
        "inputs['pair'][0]: 1 is not of type \"string\"",
        'inputs[\'pair\'][1]: "a" is not of type "integer"',
    ]


def test_a_refusal_where_pythons_re_differs_is_explained_where_it_is() -> None:
    """ECMA-262's `$` (the compiled check's) ends the string; Python's also matches before a
    final newline: explained with jsonschema, the refusal found nothing to name."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}
    assert not list(Draft202012Validator(schema).iter_errors({"id": "abc\n"}))
    assert _config(schema).input_errors({"id": "abc\n"}) == [
        'inputs[\'id\']: "abc\\n" does not match "^[a-z]+$"'
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


# Words separated by single spaces: Python's backtracking `re` takes time exponential in a
# non-matching string's length (2^40 steps here), the compiled check's automaton linear time.
WORDS_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^([a-z]+ ?)*$", "maxLength": 100}},
}
EXPLAIN_WORDS = f"""
from shared.model_repository import ModelConfig
config = ModelConfig(name="m", kind="batch", backend="identity", input_schema={WORDS_SCHEMA!r})
print(*config.input_errors({{"name": "a" * 40 + "!"}}), sep="\\n")
"""


def test_a_refusal_is_explained_without_backtracking_through_the_pattern() -> None:
    """The explanation ran on the producer's event loop with Python's `re`: one job whose text
    failed such a pattern stalled every request of the producer for hours. Run in a child,
    which a hang guard well past the expected instant can kill."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", EXPLAIN_WORDS],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("explaining one refused input hung on the pattern")
    assert done.returncode == 0, done.stderr
    assert "inputs['name']: " in done.stdout
    assert "does not match" in done.stdout


@pytest.mark.parametrize("pattern", [r"^\p{L}+$", r"^(?<word>\p{Lu}\p{Ll}*)$"])
def test_an_ecma_262_pattern_python_lacks_is_a_valid_input_schema(pattern: str) -> None:
    """JSON Schema's patterns are ECMA-262, as the compiled check's: Unicode property classes
    and named groups were refused at load as "not a 'regex'" (Python's `re` has neither)."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}}
    config = _config(schema)
    assert config.input_errors({"name": "Zoë"}) == []
    [error] = config.input_errors({"name": "Zoë 1"})
    assert error.startswith("inputs['name']: ")


def test_a_pattern_no_engine_compiles_is_refused_at_load_naming_where() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "(["}}}
    with pytest.raises(ValueError, match=r"input_schema\.properties\.name\.pattern: "):
        _config(schema)


def test_a_refused_long_value_is_quoted_cut_short() -> None:
    """A 16 KB prompt over its maxLength was quoted whole in the 422; the reason after it
    (what the user needs) stays whole, and a short value is quoted as it is."""
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 10}}}
    [error] = _config(schema).input_errors({"text": "y" * 16_384})
    quoted = '"' + "y" * 199
    assert (
        error
        == f"inputs['text']: {quoted}… (16386 characters of JSON) is longer than 10 characters"
    )
    assert _config(schema).input_errors({"text": "y" * 11}) == [
        f"inputs['text']: \"{'y' * 11}\" is longer than 10 characters"
    ]
