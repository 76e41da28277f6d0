"""Loading the model repository refuses, in one line that names the file, what no worker could
serve: a missing folder, a config.yaml that is not YAML or not a mapping, an engine that does
not exist. Before, these served no models at all, printed a traceback, or were accepted by the
producer (which queued jobs for them) and failed only when a worker started."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from producer_api.app import build_state
from shared.model_repository import (
    BACKEND_NAMES,
    PREPARED_POSITIONS,
    PREPARER_NAMES,
    ModelConfig,
    ModelConfigError,
    ModelRepository,
)
from shared.settings import Settings
from workers.engines.registry import BACKENDS, EngineNotFound, create_engine, engine_class
from workers.engines.text_encoding import POSITIONS
from workers.model_prep import PREPARERS
from workers.model_prep.minilm import packaged_model_dir
from workers.runtime.consumer_runtime import ConsumerRuntime

REPO_ROOT = Path(__file__).resolve().parent.parent


def _repository(root: Path, text: str) -> Path:
    (root / "m").mkdir(parents=True)
    (root / "m" / "config.yaml").write_text(text)
    return root / "m" / "config.yaml"


def test_a_missing_folder_is_an_error_and_an_empty_one_an_empty_repository(
    tmp_path: Path,
) -> None:
    with pytest.raises(ModelConfigError, match=f"^model repository {tmp_path / 'x'} is not a"):
        ModelRepository.load(tmp_path / "x")
    assert list(ModelRepository.load(tmp_path)) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("kind: batch\nbackend: [\n", "not YAML: while parsing a flow node"),
        ("- kind\n- batch\n", "not a mapping of settings"),
        ("backend: identity\n", "kind: Field required"),
        (
            "kind: batch\nbackend: onnxrt\n",
            "model m variant default: unknown backend 'onnxrt'; one of identity, onnxruntime, "
            "tensorrt, torch, vllm, or a custom engine's `package.module:Class`",
        ),
        (  # a variant's own engine is checked as well
            "kind: batch\nbackend: identity\nvariants: {default: {}, gpu: {backend: 'a:b:c'}}\n",
            "model m variant gpu: unknown backend 'a:b:c'",
        ),
        (  # jsonschema's SchemaError used to escape as a many-line dump of the metaschema
            "kind: batch\nbackend: identity\ninput_schema: {type: strng}\n",
            "model m: input_schema.type: 'strng' is not valid under any of the given schemas",
        ),
        (
            "kind: batch\nbackend: identity\n"
            "input_schema: {type: object, properties: {x: {minimum: a}}}\n",
            "model m: input_schema.properties.x.minimum: 'a' is not of type 'number'",
        ),
        (  # a worker's reclaimer died converting it to XAUTOCLAIM's milliseconds
            "kind: batch\nbackend: identity\nqueue: {visibility_timeout_s: .inf}\n",
            "queue.visibility_timeout_s: Input should be a finite number",
        ),
        (  # NaN was refused as if it were negative
            "kind: batch\nbackend: identity\nmax_queue_delay_ms: .nan\n",
            "max_queue_delay_ms: Input should be a finite number",
        ),
        (  # a budget no call can meet would cap every contended micro-batch at one job
            "kind: batch\nbackend: identity\nqueue: {fair_batch_ms: 0}\n",
            "queue.fair_batch_ms: Input should be greater than 0",
        ),
        (
            "kind: batch\nbackend: identity\nqueue: {max_queue_time_s: 1e300}\n",
            "queue.max_queue_time_s: Input should be less than or equal to 31536000",
        ),
        (  # the worker died in the tokenizer ("can't convert negative int to unsigned")
            "kind: batch\nbackend: onnxruntime\nparameters: {max_seq_length: -5}\n",
            "model m variant default: parameters.max_seq_length: Input should be greater than or "
            "equal to 2",
        ),
        (  # the tokenizer cannot cut below its two special tokens: 1 truncated nothing at all
            "kind: batch\nbackend: onnxruntime\nparameters: {max_seq_length: 1}\n",
            "model m variant default: parameters.max_seq_length: Input should be greater than or "
            "equal to 2",
        ),
        (  # a variant's engine reads the model's parameters merged with its own
            "kind: batch\nbackend: identity\n"
            "variants: {default: {}, t: {backend: torch, parameters: {intra_op_threads: -1}}}\n",
            "model m variant t: parameters.intra_op_threads: Input should be greater than or equal "
            "to 0",
        ),
        (  # read as 1 thread
            "kind: batch\nbackend: onnxruntime\nparameters: {intra_op_threads: true}\n",
            "model m variant default: parameters.intra_op_threads: Input should be a valid integer",
        ),
        (  # read as 64 tokens
            "kind: batch\nbackend: onnxruntime\nparameters: {max_seq_length: '64'}\n",
            "model m variant default: parameters.max_seq_length: Input should be a valid integer",
        ),
        (  # a typo (1000 for 100) started that many threads per ONNX Runtime session
            "kind: batch\nbackend: onnxruntime\nparameters: {intra_op_threads: 1025}\n",
            "model m variant default: parameters.intra_op_threads: Input should be less than or "
            "equal to 1024",
        ),
        (  # was found only when a torch worker loaded the engine
            "kind: batch\nbackend: torch\nparameters: {torch: {cuda_graphs: "
            "{batch_buckets: [1], seq_buckets: [32, 128]}}}\n",
            "model m variant default: max_seq_length 256 exceeds the largest of "
            "parameters.torch.cuda_graphs.seq_buckets (128)",
        ),
        (  # a bucket past the model's 512 positions failed capture at warm-up: a crash loop
            "kind: batch\nbackend: torch\nprepare: minilm\nparameters: {torch: {cuda_graphs: "
            "{batch_buckets: [1], seq_buckets: [256, 1024]}}}\n",
            "model m variant default: parameters.torch.cuda_graphs.seq_buckets [256, 1024] exceed "
            "the 512 positions of the model `prepare: minilm` builds",
        ),
        (  # accepted, then every worker failed at engine load and restarted into it again
            "kind: batch\nbackend: onnxruntime\nprepare: minilm\n"
            "parameters: {max_seq_length: 1024}\n",
            "model m variant default: max_seq_length 1024 exceeds the 512 positions of the model "
            "`prepare: minilm` builds",
        ),
        (  # a variant's own engine and length are checked as well
            "kind: batch\nbackend: identity\nprepare: minilm\n"
            "variants: {default: {}, gpu: {backend: tensorrt, "
            "parameters: {max_seq_length: 513}}}\n",
            "model m variant gpu: max_seq_length 513 exceeds the 512 positions",
        ),
        (  # `conveyor models prepare` failed with a bare KeyError
            "kind: batch\nbackend: identity\nprepare: nope\n",
            "model m: unknown preparer 'nope'; one of minilm, smollm2",
        ),
        (  # /v1/embeddings always sends encoding_format: every call got a 422
            "kind: batch\ntask: embed\nbackend: identity\ninput_schema: {type: object, "
            "additionalProperties: false, properties: {texts: {type: array}}}\n",
            "model m: task embed needs an input_schema that accepts /v1/embeddings' inputs "
            "{texts, encoding_format}: inputs: Additional properties are not allowed "
            "('encoding_format' was unexpected)",
        ),
        (  # vLLM took it while the worker's loop kept reading the top-level one
            "kind: generate\nbackend: vllm\nparameters: {max_num_seqs: 64}\n",
            "model m variant default: parameters.max_num_seqs: set the model's top-level "
            "max_num_seqs instead",
        ),
        (
            "kind: generate\nbackend: vllm\n"
            "variants: {default: {}, big: {parameters: {max_num_seqs: 64}}}\n",
            "model m variant big: parameters.max_num_seqs: set the model's top-level max_num_seqs",
        ),
        (  # a string or a float: the producer answered 500 to every request that named a
            # max_tokens, and the worker failed every job
            "kind: generate\nbackend: vllm\nparameters: {max_tokens_limit: 1e3}\n",
            "model m variant default: parameters.max_tokens_limit: Input should be a valid "
            "integer, not 1000.0",
        ),
        (
            "kind: generate\nbackend: vllm\n"
            "variants: {default: {}, short: {parameters: {default_max_tokens: 0}}}\n",
            "model m variant short: parameters.default_max_tokens: Input should be greater than "
            "or equal to 1",
        ),
        (  # the producer served the model by its kind, the worker by its engine
            "kind: batch\nbackend: vllm\n",
            "model m variant default: backend vllm serves kind generate, not batch",
        ),
        (
            "kind: generate\nbackend: identity\nvariants: {default: {}, gpu: {backend: torch}}\n",
            "model m variant default: backend identity serves kind batch, not generate",
        ),
        (  # Python's `$` matched before the final newline: a variant named so was served
            'kind: batch\nbackend: identity\nvariants: {"a\\n": {}}\ndefault_variant: "a\\n"\n',
            "'a\\n' is not a valid model or variant name",
        ),
        (  # KEDA refuses the ScaledObject; render used to clamp it silently
            "kind: batch\nbackend: identity\nautoscaling: {min_replicas: 3, max_replicas: 1}\n",
            "autoscaling: min_replicas (3) exceeds max_replicas (1)",
        ),
        (  # durations are at most a year, as README says of every one
            "kind: batch\nbackend: identity\nautoscaling: {cooldown_s: 40000000}\n",
            "autoscaling.cooldown_s: Input should be less than or equal to 31536000",
        ),
        (
            "kind: batch\nbackend: identity\nautoscaling: {polling_interval_s: 40000000}\n",
            "autoscaling.polling_interval_s: Input should be less than or equal to 31536000",
        ),
    ],
)
def test_what_no_worker_could_serve_is_one_line_naming_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    config = _repository(tmp_path, text)
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"{config}: {problem}"), message
    assert "\n" not in message


def test_a_config_yaml_that_cannot_be_read_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """Not UTF-8, or not a file: the producer, the workers and the CLI died with a traceback
    (UnicodeDecodeError, IsADirectoryError) that named no file."""
    config = _repository(tmp_path, "")
    config.write_bytes(b"kind: batch\nbackend: identity\n# caf\xe9\n")  # Latin-1
    with pytest.raises(ModelConfigError, match=f"^{re.escape(str(config))}: not YAML: ") as e:
        ModelRepository.load(tmp_path)
    assert "#x00e9" in str(e.value) and "\n" not in str(e.value)
    config.unlink()
    config.mkdir()
    with pytest.raises(ModelConfigError, match=f"^{re.escape(str(config))}: cannot read: ") as e:
        ModelRepository.load(tmp_path)
    assert "\n" not in str(e.value)


def test_a_custom_engine_is_named_by_module_and_class(tmp_path: Path) -> None:
    backend = "my_company.engines:RerankEngine"  # imported by the worker, not at load
    _repository(tmp_path, yaml.safe_dump({"kind": "batch", "backend": backend}))
    [config] = ModelRepository.load(tmp_path)
    assert config.backend_of("default") == backend


def test_the_names_a_config_accepts_are_the_engines_a_worker_has() -> None:
    assert set(BACKENDS) == BACKEND_NAMES


def test_the_preparers_a_config_names_are_the_ones_the_cli_has() -> None:
    assert set(PREPARERS) == PREPARER_NAMES
    assert set(PREPARED_POSITIONS) <= PREPARER_NAMES


def test_the_positions_of_a_prepared_model_are_those_of_its_weights() -> None:
    """The cap the loader checks seq buckets against is the config.json minilm ships with."""
    config = json.loads((packaged_model_dir() / "config.json").read_text())
    assert PREPARED_POSITIONS["minilm"] == config[POSITIONS]


def test_the_shipped_models_load() -> None:
    """minilm's schema accepts what /v1/embeddings sends, and its seq buckets fit its model."""
    repository = ModelRepository.load(REPO_ROOT / "model_repository")
    assert {config.name for config in repository} >= {"identity", "minilm", "smollm2"}
    minilm = repository.get("minilm")
    assert minilm is not None and minilm.task == "embed"


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        (
            "my_company.engines:RerankEngine",
            "cannot import my_company.engines:RerankEngine: No module",
        ),
        ("tests.fault_engine:FaultEngin", "has no attribute 'FaultEngin'"),
        ("json:JSONDecoder", "json:JSONDecoder is not a BatchEngine or GenerateEngine"),
    ],
)
def test_a_custom_engine_the_worker_cannot_have_is_named(backend: str, problem: str) -> None:
    """What the worker's log says when it starts: the backend, and why its class is unusable."""
    with pytest.raises(EngineNotFound, match=f"^backend {re.escape(repr(backend))}: ") as refused:
        engine_class(backend)
    assert problem in str(refused.value)
    assert engine_class("tests.fault_engine:FaultEngine").__name__ == "FaultEngine"


def test_a_custom_engine_of_the_other_kind_is_named() -> None:
    """A batch engine behind a generate model (or the reverse) was served by the loop of its
    engine while the producer served the model's kind; the worker now refuses to start."""
    config = ModelConfig(name="m", kind="generate", backend="tests.fault_engine:FaultEngine")
    with pytest.raises(EngineNotFound) as refused:
        create_engine(config, "default", Path("var/models"))
    assert str(refused.value) == (
        "backend 'tests.fault_engine:FaultEngine': FaultEngine serves kind batch; model m has "
        "kind generate"
    )


def test_a_queue_wait_longer_than_the_result_ttl_is_refused_where_both_are_known(
    tmp_path: Path,
) -> None:
    """A job hash gets the result TTL when its job is enqueued and is renewed only once the job
    ended: a queue that let a job wait longer let its hash expire under it (404 while queued, and
    the worker skipped it as missing). The producer and the worker refuse to start with such a
    config, naming both values; a wait under the TTL loads."""
    config = _repository(
        tmp_path, "kind: batch\nbackend: identity\nqueue: {max_queue_time_s: 3600}\n"
    )
    settings = Settings(model_repository=tmp_path, result_ttl_s=3600, models=["m"])
    problem = (
        f"{config}: queue.max_queue_time_s (3600.0 s) must be below CONVEYOR_RESULT_TTL_S "
        "(3600 s): a job's hash expires that long after it was enqueued, even while it waits"
    )
    for start in (build_state, ConsumerRuntime):
        with pytest.raises(ModelConfigError) as refused:
            start(settings)
        assert str(refused.value) == problem, start
    assert [c.name for c in ModelRepository.load(tmp_path, result_ttl_s=3601)] == ["m"]
