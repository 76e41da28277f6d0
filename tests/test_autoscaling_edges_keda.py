"""Edges of `conveyor render keda` and of the local autoscaler's HPA formula: names Go's YAML
reads as booleans, two pools whose names join to one object name, backlog targets rendered as
written, and targets not whole in binary (KEDA hands the HPA whole thousandths)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import redis
import yaml
from click.testing import CliRunner

from autoscaling.keda import scaled_object
from autoscaling.local_autoscaler import PoolScaler
from conveyor.cli import main
from shared.keys import Keys
from shared.model_repository import ModelConfig

KEYS = Keys("cv:")


class GoYamlBools(yaml.SafeLoader):
    """Reads `y`, `n` (any case) as Go's YAML v2 (kubectl's sigs.k8s.io/yaml) does: booleans.
    PyYAML, on YAML 1.1's narrower list, takes them for strings."""

    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


GoYamlBools.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN")
)


def _model(root: Path, name: str, *variants: str) -> None:
    folder = root / name
    folder.mkdir()
    body = {
        "kind": "batch",
        "backend": "identity",
        "default_variant": variants[0],
        "variants": {v: {} for v in variants},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(body))


def _render(root: Path) -> Any:
    return CliRunner().invoke(main, ["render", "keda", "--model-repository", str(root)])


def test_names_that_read_as_booleans_stay_strings_for_kubectl(tmp_path: Path) -> None:
    """A model named `y` rendered `conveyor.dev/model: y`: kubectl reads `true` there and refuses
    the file (`cannot unmarshal bool into … labels of type string`)."""
    _model(tmp_path, "y", "n", "default")
    result = _render(tmp_path)
    assert result.exit_code == 0, result.output
    scaled = list(yaml.load_all(result.stdout, Loader=GoYamlBools))[1:]
    labels = {
        (
            o["metadata"]["labels"]["conveyor.dev/model"],
            o["metadata"]["labels"]["conveyor.dev/variant"],
        )
        for o in scaled
    }
    assert labels == {("y", "n"), ("y", "default")}


def test_two_pools_that_render_one_name_are_one_error_naming_both(tmp_path: Path) -> None:
    """`a-b:c` and `a:b-c` both join to `worker-a-b-c`: the command ended in a traceback."""
    _model(tmp_path, "a-b", "c")
    _model(tmp_path, "a", "b-c")
    result = _render(tmp_path)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert "a-b:c" in line and "a:b-c" in line and "worker-a-b-c" in line, line


def test_a_target_not_whole_in_binary_gets_one_replica_per_job(
    redis_client: redis.Redis,
) -> None:
    """Three queued 20 s jobs at `target_s: 0.1` scale on 3 * 0.1 = 0.30000000000000004 s: over
    a float target the formula asked for 4 replicas, one of them idle; KEDA hands the HPA both
    in thousandths (300 and 100), and it asks for 3."""
    config = ModelConfig.model_validate(
        {
            "name": "edge-tenth",
            "kind": "batch",
            "backend": "identity",
            "autoscaling": {
                "metric": "backlog_seconds",
                "backlog": {"target_s": 0.1, "cost_estimate_s": 20.0},
                "max_replicas": 10,
            },
        }
    )
    stream = KEYS.queue("edge-tenth", "default")
    redis_client.delete(stream, KEYS.service_cost("edge-tenth", "default"))
    for _ in range(3):
        redis_client.xadd(stream, {"job": "x"})
    scaler = PoolScaler.for_partition(config, "default", KEYS, str, lambda _: None, bool)
    try:
        assert scaler.tick(redis_client) == 3
    finally:
        scaler.release(redis_client)
        redis_client.delete(stream)


def test_a_backlog_target_renders_as_configured() -> None:
    """`{target_s:g}` kept six digits: `target_s: 1234.5678` rendered `1234.57`, and KEDA scaled
    on a target the config does not say (`1e+06` for a round million, too)."""
    for target_s, rendered in ((1234.5678, "1234.5678"), (1e6, "1000000"), (0.1, "0.1")):
        config = ModelConfig.model_validate(
            {
                "name": "edge-target",
                "kind": "batch",
                "backend": "identity",
                "autoscaling": {"metric": "backlog_seconds", "backlog": {"target_s": target_s}},
            }
        )
        (trigger,) = scaled_object(config, "default", KEYS)["spec"]["triggers"]
        assert trigger["metadata"]["targetValue"] == rendered
