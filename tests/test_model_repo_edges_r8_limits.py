"""Config values that loaded and then failed far from the file that set them: a variant weight
too large for a float (the producer died seeding its routes, OverflowError, or served NaN
weights), a custom backend with a trailing newline (Python's `$` matched before it: the producer
queued jobs that no worker could import an engine for), an `artifact` outside the model's
artifact folder (`conveyor models prepare` wrote the ONNX graph wherever it pointed), a lag KEDA
cannot parse (the pool never scaled) and a `!!set` or `!!binary` (a TypeError traceback). A
model's linked folder that leads nowhere was skipped, and the model went unserved, silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository
from shared.routing import seed_routes
from tests.test_config_yaml_types import load_one


def _refusal(root: Path, text: str) -> str:
    with pytest.raises(ModelConfigError) as refused:
        load_one(root, text)
    message = str(refused.value)
    assert message.startswith(f"{root / 'm' / 'config.yaml'}: "), message
    assert "\n" not in message
    return message


PAST_A_FLOAT = "1" + "0" * 400  # float() of it raises OverflowError
NEAR_A_FLOAT = "1" + "0" * 308  # two of them sum to inf, and every share to NaN


@pytest.mark.parametrize(
    "variants",
    [
        f"{{default: {{weight: {PAST_A_FLOAT}}}}}",
        f"{{default: {{weight: {NEAR_A_FLOAT}}}, b: {{weight: {NEAR_A_FLOAT}}}}}",
    ],
    ids=["past-a-float", "summing-past-a-float"],
)
def test_a_weight_no_float_holds_is_refused(tmp_path: Path, variants: str) -> None:
    message = _refusal(tmp_path, f"variants: {variants}\n")
    assert "variants.default.weight: Input should be less than or equal to" in message


def test_the_largest_weight_seeds_routes_that_serve(tmp_path: Path) -> None:
    config = load_one(
        tmp_path, f"variants: {{default: {{weight: {2**53}}}, b: {{weight: {2**53}}}}}\n"
    ).get("m")
    assert config is not None
    routes = seed_routes(config)
    routes.check(config)
    assert routes.weights == {"default": 50.0, "b": 50.0}


def test_a_custom_backend_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    message = _refusal(tmp_path, 'variants: {default: {backend: "pkg.mod:Engine\\n"}}\n')
    assert "model m variant default: unknown backend 'pkg.mod:Engine\\n'" in message


@pytest.mark.parametrize("artifact", ["/etc/model.onnx", "../other/model.onnx", "a/../../x.onnx"])
def test_an_artifact_outside_the_model_folder_is_refused(tmp_path: Path, artifact: str) -> None:
    message = _refusal(tmp_path, f"artifact: {artifact}\n")
    assert f"artifact: {artifact!r} is not a file inside the model's artifact folder" in message


def test_an_artifact_inside_the_model_folder_loads(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(
        "kind: batch\nbackend: onnxruntime\nartifact: onnx/encoder.onnx\n"
    )
    config = ModelRepository.load(tmp_path).get("m")
    assert config is not None and config.artifact == "onnx/encoder.onnx"


@pytest.mark.parametrize("target", ["gone", "m"], ids=["nothing", "itself"])
def test_a_linked_folder_that_leads_nowhere_is_refused_by_name(tmp_path: Path, target: str) -> None:
    """A model linked in from a volume that is not mounted: its link was no folder, and the
    model went unserved without a word, as a folder without its config.yaml did."""
    (tmp_path / "m").symlink_to(tmp_path / target)
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path / 'm'}: cannot read: a link to no folder")


@pytest.mark.parametrize("field", ["activation_lag"])
def test_a_lag_keda_cannot_parse_is_refused(tmp_path: Path, field: str) -> None:
    """KEDA parses a redis-streams trigger's counts as int64: `conveyor render` wrote a
    ScaledObject whose scaler KEDA never built, and the pool never scaled. (`lag_per_replica`
    has a lower bound, the HPA's: tests/test_model_repository_r27_autoscaling.py.)"""
    message = _refusal(tmp_path, f"autoscaling: {{{field}: {2**63}}}\n")
    assert f"autoscaling.{field}: Input should be less than or equal to {2**63 - 1}" in message
    (tmp_path / "ok").mkdir()
    assert load_one(tmp_path / "ok", f"autoscaling: {{{field}: {2**63 - 1}}}\n").get("m")


@pytest.mark.parametrize(
    ("text", "tag", "line"),
    [
        ("max_batch_size: !!set {a}\n", "set", 3),
        ("variants:\n  default:\n    backend: !!binary aGk=\n", "binary", 5),
        ("parameters: {x: !!set {a}}\n", "set", 3),
    ],
)
def test_a_yaml_value_json_has_none_of_is_refused_naming_its_line(
    tmp_path: Path, text: str, tag: str, line: int
) -> None:
    """A config's values are JSON's (a refusal quotes one as JSON, an input schema and engine
    parameters are JSON): a `!!set` or `!!binary` in a typed field escaped as a TypeError
    traceback ("Type is not JSON serializable"), naming no file."""
    message = _refusal(tmp_path, text)
    assert f"not YAML: a !!{tag} has no JSON value" in message
    assert f"line {line}," in message
