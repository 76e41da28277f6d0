"""A config.yaml value of another type than its field's is refused, naming the file, the field
and the value as YAML read it. Read laxly, `max_batch_size: yes` batched by 1, `8.0` and '8'
were integers, and `fair: 1` or `shadow: 'false'` booleans (the quoted 'false' as true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository

HEAD = "kind: batch\nbackend: identity\n"


def load_one(root: Path, text: str) -> ModelRepository:
    (root / "m").mkdir()
    (root / "m" / "config.yaml").write_text(HEAD + text)
    return ModelRepository.load(root)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("max_batch_size: yes\n", "max_batch_size: Input should be a valid integer, not true"),
        ("max_batch_size: 8.0\n", "max_batch_size: Input should be a valid integer, not 8.0"),
        ("max_batch_size: '8'\n", 'max_batch_size: Input should be a valid integer, not "8"'),
        ("max_queue_delay_ms: true\n", "max_queue_delay_ms: Input should be a valid number"),
        (
            "queue: {max_queue_time_s: '600'}\n",
            'queue.max_queue_time_s: Input should be a valid number, not "600"',
        ),
        ("queue: {fair: 1}\n", "queue.fair: Input should be a valid boolean, not 1"),
        ("queue: {max_deliveries: on}\n", "queue.max_deliveries: Input should be a valid integer"),
        (
            "variants: {default: {shadow: 'false'}}\n",
            'variants.default.shadow: Input should be a valid boolean, not "false"',
        ),
        ("variants: {default: {weight: 50.0}}\n", "variants.default.weight: Input should be a"),
        ("preferred_batch_sizes: [true]\n", "preferred_batch_sizes.0: Input should be a valid"),
        ("autoscaling: {cooldown_s: '120'}\n", "autoscaling.cooldown_s: Input should be a valid"),
        (
            "variants: {default: {backend: torch, parameters: {torch: {compile: 1}}}}\n",
            "model m variant default: parameters.torch: compile: Input should be a valid boolean, "
            "not 1",
        ),
    ],
)
def test_a_value_of_another_type_is_refused_naming_field_and_value(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, text)
    assert str(refused.value).startswith(f"{tmp_path / 'm' / 'config.yaml'}: {problem}")


def test_yaml_booleans_whole_numbers_and_exponents_load_as_numbers(tmp_path: Path) -> None:
    """YAML 1.1's `on` is a boolean, an integer is a number of seconds, and `6e2` is 600 as in
    YAML 1.2 and JSON: PyYAML alone read it, and `1.0e3`, as strings."""
    text = "queue: {fair: on, max_run_s: 2, max_queue_time_s: 6e2, visibility_timeout_s: 1.2e1}\n"
    config = load_one(tmp_path, text).get("m")
    assert config is not None
    assert config.queue.fair is True and config.queue.max_run_s == 2.0
    assert (config.queue.max_queue_time_s, config.queue.visibility_timeout_s) == (600.0, 12.0)
