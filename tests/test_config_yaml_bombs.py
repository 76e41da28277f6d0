"""A config.yaml that would take every producer and worker down as it loads is refused in one
line naming the file: aliases that expand past reason (a billion laughs, 10^6 values from a few
hundred bytes here; 10^9 took every process down for memory where the input schema is
compiled), an alias inside what it names (a cycle: a RecursionError traceback, or accepted under
`parameters`), nesting deeper than PyYAML's recursion (a traceback) and a file past 1 MiB.
Anchors and merge keys that share a few settings still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError
from tests.test_config_yaml_types import load_one


def _laughs(levels: int) -> str:
    """`parameters` holding lists of ten aliases of the list before, each level ten times the
    last: 10^(levels + 1) values, expanded."""
    lines = ["  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, levels + 1)]
    return (
        "parameters:\n"
        + "\n".join(lines)
        + f"\ninput_schema: {{type: object, default: *a{levels}}}\n"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (_laughs(5), "more than 100000 values, its aliases expanded"),
        (
            "input_schema: &s {type: object, properties: {a: *s}}\n",
            "an alias names a collection it is in",
        ),
        ("parameters: &p {x: *p}\n", "an alias names a collection it is in"),
        (f"parameters: {{x: {'[' * 2000}{']' * 2000}}}\n", "nested deeper than 64 levels"),
        (f"parameters: {{x: {'[' * 70}{']' * 70}}}\n", "nested deeper than 64 levels"),
        ("#" * (1 << 20) + "\n", f"larger than {1 << 20} bytes"),
    ],
    ids=["billion-laughs", "schema-cycle", "parameters-cycle", "deep", "deeper-than-64", "huge"],
)
def test_a_config_that_would_exhaust_its_reader_is_one_line_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, text)
    assert str(refused.value) == f"{tmp_path / 'm' / 'config.yaml'}: {problem}"


def test_anchors_and_merge_keys_that_share_settingsload_one(tmp_path: Path) -> None:
    text = (
        "variants:\n"
        "  default: &base {weight: 50, parameters: {threads: 2}}\n"
        "  b: {<<: *base, weight: 0}\n"
        "  c: *base\n"
    )
    config = load_one(tmp_path, text).get("m")
    assert config is not None
    assert [config.variants[v].weight for v in ("default", "b", "c")] == [50, 0, 50]
    assert config.variant_parameters("b") == {"threads": 2}
