"""A config.yaml that says two things at once, or one thing no worker or producer can do, is
refused at load in one line naming the file and the field. Each of these loaded before: a key
given twice (read as its last value, silently), a `directory:` (replaced, silently), a visibility
timeout a batch's gather outlasts or that XAUTOCLAIM reads as 0 ms (jobs still in hand claimed
and run again until dead-lettered), a shadow default variant (config.yaml's own routes invalid),
an input_schema no JSON object passes (every submit 422), a vLLM `model` or `tokenizer` other
than the worker's artifact folder (fed the ids of another tokenizer) and a replica count past
Kubernetes' int32 (a rendered ScaledObject the API server refuses)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from shared.model_repository import ModelConfigError, ModelRepository
from shared.routing import seed_routes
from tests.test_config_yaml_types import HEAD, load_one


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("max_batch_size: 8\nmax_batch_size: 64\n", "max_batch_size", 4),
        ("queue:\n  max_length: 5\n  max_length: 7\n", "max_length", 5),
        ("queue: {max_length: 5, max_length: 7}\n", "max_length", 3),
        ("variants:\n  default: {}\n  a: {weight: 1}\n  a: {weight: 2}\n", "a", 6),
        ("backend: torch\n", "backend", 3),
    ],
    ids=["top-level", "nested", "flow", "variant", "required"],
)
def test_a_key_given_twice_is_refused_naming_it_and_its_line(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    """YAML says a mapping's keys are unique; PyYAML kept the last, and the first (perhaps the
    one its author meant) was ignored without a word."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, text)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'm' / 'config.yaml'}: "), message
    assert f"key {key!r} given twice" in message and f"line {line}," in message, message
    assert "\n" not in message


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    """A merged (`<<: *base`) key set again is an override, not a duplicate, however merged
    mappings nest, and whichever PyYAML builds first: here `default` merges `mid` (flattening
    it) before `mid`, deeper in `parameters`, is built itself."""
    text = (
        "parameters: {p: {q: &mid {<<: &base {weight: 1, shadow: false}, weight: 2}}}\n"
        "variants:\n"
        "  default: {<<: *mid, weight: 3}\n"
        "  b: *mid\n"
        "  c: {<<: [*mid, *base], shadow: true}\n"
    )
    config = load_one(tmp_path, text).get("m")
    assert config is not None
    assert [config.variants[v].weight for v in ("default", "b", "c")] == [3, 2, 2]
    assert config.variants["c"].shadow is True
    assert config.parameters == {"p": {"q": {"weight": 2, "shadow": False}}}


def test_directory_is_no_setting(tmp_path: Path) -> None:
    """The loader sets `directory` to the model's folder: one a config.yaml gave was accepted
    and replaced, silently, as no other unknown key is."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, "directory: /srv/models/m\n")
    assert str(refused.value) == (
        f"{tmp_path / 'm' / 'config.yaml'}: directory: Extra inputs are not permitted"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "max_queue_delay_ms: 5000\nqueue: {visibility_timeout_s: 5}\n",
            "model m: max_queue_delay_ms (5000) must be below queue.visibility_timeout_s (5 s)",
        ),
        (
            "max_queue_delay_ms: 60000\nqueue: {visibility_timeout_s: 1}\n",
            "model m: max_queue_delay_ms (60000) must be below queue.visibility_timeout_s (1 s)",
        ),
        (
            "max_queue_delay_ms: 0\nqueue: {visibility_timeout_s: 0.0004}\n",
            "queue.visibility_timeout_s: 0.0004 is below 0.001",
        ),
    ],
)
def test_a_visibility_timeout_a_batch_outlasts_while_gathering_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    """The gather (workers/partition/stream_reader.py) touches none of the entries it holds:
    past the visibility timeout another worker's reclaimer takes them and runs them again."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, text)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'm' / 'config.yaml'}: {problem}"), message
    assert "\n" not in message


def test_a_gather_within_the_visibility_timeout_loads(tmp_path: Path) -> None:
    """As does a generate model's any delay: it gathers nothing, and never reads it."""
    text = "max_queue_delay_ms: 999\nqueue: {visibility_timeout_s: 1}\n"
    config = load_one(tmp_path, text).get("m")
    assert config is not None and config.queue.visibility_timeout_s == 1
    (tmp_path / "g" / "m").mkdir(parents=True)
    (tmp_path / "g" / "m" / "config.yaml").write_text(
        "kind: generate\nbackend: vllm\nmax_queue_delay_ms: 5000\n"
        "queue: {visibility_timeout_s: 2}\n"
    )
    assert ModelRepository.load(tmp_path / "g").get("m") is not None


@pytest.mark.parametrize(
    ("variants", "default"),
    [
        ("{default: {shadow: true}}", "default"),
        ("{a: {weight: 0}, s: {shadow: true}}", "s"),
        ("{a: {weight: 100}, s: {shadow: true, weight: 0}}", "s"),
    ],
)
def test_a_shadow_default_variant_is_refused(tmp_path: Path, variants: str, default: str) -> None:
    """The default variant takes every request naming none while no variant has weight, and is
    a canary's baseline: one that is a shadow (copies only) left config.yaml's own routes invalid
    ("weights must sum to 100, not 0") while requests naming no variant ran on it."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, f"variants: {variants}\ndefault_variant: {default}\n")
    assert str(refused.value).startswith(
        f"{tmp_path / 'm' / 'config.yaml'}: model m: default_variant {default!r} is a shadow "
        "(`shadow: true`)"
    ), refused.value


def test_the_routes_a_loaded_config_seeds_can_serve(tmp_path: Path) -> None:
    config = load_one(
        tmp_path, "variants: {a: {weight: 0}, s: {shadow: true}}\ndefault_variant: a\n"
    ).get("m")
    assert config is not None
    routes = seed_routes(config)
    routes.check(config)
    assert routes.weights == {"a": 100.0} and routes.shadows == {"s": 1.0}


@pytest.mark.parametrize(
    ("schema", "named"),
    [("{type: array, items: {type: string}}", '"array"'), ("{type: [string, 'null']}", "string")],
)
def test_an_input_schema_no_object_passes_is_refused(
    tmp_path: Path, schema: str, named: str
) -> None:
    """A job's `inputs` is a JSON object (producer_api/jobs/protocol.py): a schema of another
    type loaded, and then every submit was refused, 422."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, f"input_schema: {schema}\n")
    message = str(refused.value)
    assert message.startswith(
        f"{tmp_path / 'm' / 'config.yaml'}: model m: input_schema.type: a job's inputs are a "
        "JSON object, which type "
    ), message
    assert named in message


def test_an_input_schema_that_takes_objects_among_others_loads(tmp_path: Path) -> None:
    config = load_one(tmp_path, "input_schema: {type: [object, 'null']}\n").get("m")
    assert config is not None and config.input_errors({"a": 1}) == []


@pytest.mark.parametrize("key", ["model", "tokenizer"])
def test_a_vllm_model_or_tokenizer_of_its_own_is_refused(tmp_path: Path, key: str) -> None:
    """The vLLM worker tokenises prompts with its artifact folder's tokenizer and passes the
    ids on (workers/engines/vllm_engine.py): a `model` or `tokenizer` engine argument replaced
    what vLLM loads, silently, so another model was fed those ids (or, a hub name, offline,
    failed every worker's start)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(
        "kind: generate\nbackend: vllm\n"
        f"variants: {{default: {{}}, big: {{parameters: {{{key}: /srv/other-model}}}}}}\n"
    )
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value).startswith(
        f"{tmp_path / 'm' / 'config.yaml'}: model m variant big: parameters.{key}: the worker "
        "serves the model in its artifact folder"
    ), refused.value


def test_the_cli_says_so_in_one_line(tmp_path: Path, settings_env: Callable[..., None]) -> None:
    """`conveyor models list`, the check an operator runs on a repository: exit 1, one line
    naming the file, the key and its line, no traceback."""
    load_one(tmp_path, "")
    (tmp_path / "m" / "config.yaml").write_text(HEAD + "queue:\n  max_length: 5\n  max_length: 7\n")
    settings_env(CONVEYOR_MODEL_REPOSITORY=str(tmp_path))
    result = CliRunner().invoke(main, ["models", "list"])
    assert result.exit_code == 1 and result.exception is not None
    assert isinstance(result.exception, SystemExit), result.exception
    [line] = result.output.splitlines()
    assert line.startswith(f"Error: {tmp_path / 'm' / 'config.yaml'}: not YAML: key 'max_length' ")
    assert "line 5," in line


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{max_replicas: 2147483648}", "max_replicas"),
        ("{min_replicas: 2147483648, max_replicas: 2147483647}", "min_replicas"),
    ],
)
def test_a_replica_count_kubernetes_cannot_hold_is_refused(
    tmp_path: Path, text: str, field: str
) -> None:
    """KEDA's minReplicaCount and maxReplicaCount (and the HPA's) are int32: `conveyor render`
    wrote a ScaledObject the API server refuses."""
    with pytest.raises(ModelConfigError) as refused:
        load_one(tmp_path, f"autoscaling: {text}\n")
    assert str(refused.value) == (
        f"{tmp_path / 'm' / 'config.yaml'}: autoscaling.{field}: Input should be less than or "
        "equal to 2147483647"
    )
