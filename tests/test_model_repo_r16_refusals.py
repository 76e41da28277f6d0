"""A config.yaml mistake is refused in one line that names the file and the field: a document
that is no mapping though YAML reads it as false (`[]`, `0`, `''`) was read as an empty mapping
and refused for missing `kind`, an empty file the same, and an integer past 64 bits where a
number of another type belongs escaped as a TypeError traceback, its value not quotable."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository

HEAD = "kind: batch\nbackend: identity\n"
HUGE = "1" + "0" * 400  # an integer no 64 bits hold


def refusal(root: Path, text: str) -> str:
    """The one line loading a repository of model `m` with this config.yaml is refused in."""
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(text)
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(root)
    return str(refused.value)


@pytest.mark.parametrize("text", ["[]\n", "0\n", "false\n", "''\n"])
def test_a_document_yaml_reads_as_false_is_no_mapping(tmp_path: Path, text: str) -> None:
    assert refusal(tmp_path, text) == f"{tmp_path / 'm' / 'config.yaml'}: not a mapping of settings"


@pytest.mark.parametrize("text", ["", "# kind: batch\n", "---\n"])
def test_an_empty_config_is_refused_as_empty(tmp_path: Path, text: str) -> None:
    assert refusal(tmp_path, text) == f"{tmp_path / 'm' / 'config.yaml'}: empty, no settings"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"max_queue_delay_ms: {HUGE}\n", "max_queue_delay_ms: Input should be a valid number"),
        (f"queue: {{fair: {HUGE}}}\n", "queue.fair: Input should be a valid boolean"),
        (f"name: [{HUGE}]\n", "name: Input should be a valid string"),
    ],
)
def test_an_integer_past_64_bits_of_another_type_is_quoted(
    tmp_path: Path, text: str, field: str
) -> None:
    problem = refusal(tmp_path, HEAD + text)
    assert problem.startswith(f"{tmp_path / 'm' / 'config.yaml'}: {field}, not ")
    assert "1000000000" in problem and "characters of JSON" in problem


def test_an_input_past_64_bits_is_explained(tmp_path: Path) -> None:
    """The producer explains a refused submit with input_errors: a job's integer past 64 bits
    (JSON has no bound) escaped it as a TypeError."""
    schema = "input_schema: {type: object, properties: {n: {maximum: 1}}}\n"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(HEAD + schema)
    config = ModelRepository.load(tmp_path).models["m"]
    assert config.input_errors({"n": 10**30}) == [
        f"inputs['n']: {10**30} is greater than the maximum of 1"
    ]
