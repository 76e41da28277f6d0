"""Triton-style model repository: `model_repository/<model>/config.yaml` is the one description
of a model, read here by the producer (validation, routing), the workers (engine, batching),
autoscaling (KEDA rendering) and the benchmarks alike."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, NamedTuple, NoReturn

import jsonschema_rs
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.codec import dumps
from shared.limits import YEAR_S
from shared.model_names import NAME_PATTERN
from shared.settings import get_settings

log = logging.getLogger(__name__)


# The engines workers/engines/registry.py knows by name; any other backend is a custom engine
# named `package.module:Class` (as Triton's Python backend keeps a model's code beside it).
BACKEND_NAMES = frozenset({"identity", "onnxruntime", "tensorrt", "torch", "vllm"})
# Matched whole (fullmatch): `$` matched before a final newline, and such a name loaded while
# no worker could import its class; so did a module path with an empty part (`pkg.:Engine`,
# `pkg..engines:Engine`), which no import finds.
CUSTOM_BACKEND = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*:[A-Za-z_]\w*")
# The named backends that generate (continuous batching); every other named one batches.
GENERATE_BACKENDS = frozenset({"vllm"})
# vLLM engine arguments the worker sets itself: the artifact folder, whose tokenizer turns
# prompts into the ids vLLM is given.
VLLM_ARTIFACT_ARGS = frozenset({"model", "tokenizer"})
# The engines that tokenise texts themselves and read EncoderParameters.
ENCODER_BACKENDS = frozenset({"onnxruntime", "tensorrt", "torch"})
# The named engines that load what `prepare` builds (identity loads nothing).
ARTIFACT_BACKENDS = ENCODER_BACKENDS | GENERATE_BACKENDS
QUOTED_CHARS = 200  # of a refused value, quoted in its 422
DICT_KEY = "[key]"  # the last place pydantic gives a mapping's key of the wrong type
NOT_A_STRING_KEY = "is not a string, as JSON's keys are"
DEFAULT_MAX_SEQ_LENGTH = 256  # tokens per text, special ones included; longer texts are truncated
# The artifact builders workers/model_prep knows by name (`prepare:`, `conveyor models prepare`),
# each with the kind of model it builds: an encoder's ONNX graph and weights, or vLLM's Hugging
# Face folder. A named backend of the other kind failed every load on what was built.
PREPARED_KINDS = {"minilm": "batch", "smollm2": "generate"}
PREPARER_NAMES = frozenset(PREPARED_KINDS)
# The token positions of the encoder a preparer builds (`max_position_embeddings` of the
# config.json it writes), known before any artifact exists: a CUDA-graph seq bucket past them
# fails capture at warm-up, and the worker restarts into the same failure.
PREPARED_POSITIONS = {"minilm": 512}


# The most intra_op_threads a config may set, on any machine: more CPUs than the largest machine a
# worker may run on has (cloud VMs top out under 900 vCPUs), so a count past it is a typo that
# started that many threads per ONNX Runtime session or for PyTorch. The producer checks it too,
# not knowing the workers' machines; a worker refuses a count past its own (cpu_budget.py).
MAX_INTRA_OP_THREADS = 1024


# What /v1/embeddings submits to a `task: embed` model (producer_api/openai/protocol.py), at
# least: its schema must accept it.
EMBED_INPUTS = {"texts": ["x"], "encoding_format": "base64"}


# Every part of a config.yaml: an unknown field is a typo, an infinite or NaN number (YAML's
# `.inf`, `.nan`) would overflow where it becomes milliseconds (XAUTOCLAIM's idle time), and a
# value of another type is one too: lax, `max_batch_size: yes` batched by 1, `1.0` and '8' passed
# as integers and `fair: 1` or 'false' as booleans (YAML's own `true`, `yes`, `on` still are).
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# max_tokens of a generate job that names none, on a model that names no `default_max_tokens`
# (`unnamed_max_tokens`).
UNNAMED_MAX_TOKENS = 128


def max_tokens_limit(parameters: dict[str, Any]) -> int | None:
    """The variant's `max_tokens_limit`, None where it sets none: a `null` (a variant lifting its
    model's limit) is none, as GenerateParameters loads it and the producer reads it, where
    `int(None)` failed every job of the model on the worker."""
    limit = parameters.get("max_tokens_limit")
    return None if limit is None else int(limit)


def unnamed_max_tokens(parameters: dict[str, Any]) -> int:
    """The max_tokens a generate job naming none runs with, by its variant's `parameters`: its
    `default_max_tokens` (within its limit, as loaded), else UNNAMED_MAX_TOKENS cut at the limit
    as the engine cuts it; the worker's request and the backlog's estimate alike."""
    default = parameters.get("default_max_tokens")
    if default is not None:
        return int(default)
    return min(UNNAMED_MAX_TOKENS, max_tokens_limit(parameters) or UNNAMED_MAX_TOKENS)


# The most jobs one worker's read may take at once (`max_batch_size`, a variant's too, and
# `max_num_seqs`): its XREADGROUP COUNT, claimed in one Lua call that holds the server meanwhile
# (a reclaim's XAUTOCLAIM COUNT too). Four times vLLM's largest default max_num_seqs (1024); past
# it a size is a typo, and past 2**63 Redis refuses the COUNT, failing every read of the worker.
MAX_JOBS_PER_READ = 4096


# KEDA's minReplicaCount and maxReplicaCount, and the HPA's, are int32: the API server refuses
# a ScaledObject past them.
MAX_REPLICAS = 2**31 - 1
# KEDA parses a redis-streams trigger's counts (`streamLength`, `activationLagCount`) as int64:
# past it the scaler is never built, and the pool never scales.
MAX_KEDA_COUNT = 2**63 - 1
# The largest AverageValue target the HPA reads whole: it reads one in thousandths as an int64
# (resource.Quantity's MilliValue), which wraps past it, and the pool stayed at its minimum (a
# negative target) or jumped to its maximum. `activationLagCount` stays KEDA's (compared whole).
MAX_HPA_TARGET = MAX_KEDA_COUNT // 1000


# Bounds on a config.yaml, which is a few KB: past them a file is a mistake or a YAML bomb.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000  # mappings, lists and scalars, aliases expanded
MAX_CONFIG_DEPTH = 64  # of nested mappings and lists


class ModelConfigError(ValueError):
    """A config.yaml that cannot describe a servable model."""


# The largest variant weight: weights become floats where routes are seeded (shared/routing.py),
# and past 2**53 a float no longer holds every integer; far past it (~1.8e308) the conversion
# raised OverflowError at the producer's start, or two weights summed to inf and every share was
# NaN. Weights are shares, so a larger one is a typo.
MAX_WEIGHT = 2**53


class Variant(BaseModel):
    model_config = STRICT

    weight: int = Field(default=100, ge=0, le=MAX_WEIGHT)
    shadow: bool = False
    # A shadow variant's share of online requests copied to its bulk lane (live routes seed).
    sample_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    parameters: dict[str, Any] = Field(default_factory=dict)
    # A variant may run the same model on another engine (A/B of backends through one API).
    backend: str | None = None
    # A variant on another engine may batch otherwise: a GPU's best micro-batch is many times a
    # CPU's (unset: the model's `max_batch_size`).
    max_batch_size: int | None = Field(default=None, ge=1, le=MAX_JOBS_PER_READ)
    preferred_batch_sizes: list[int] | None = None


class CudaGraphBuckets(BaseModel):
    """Shapes a micro-batch is padded up to; one CUDA graph is captured per (batch, seq) pair."""

    model_config = STRICT

    batch_buckets: list[int] = Field(default_factory=lambda: [1, 8, 32, 64, 128, 256])
    seq_buckets: list[int] = Field(default_factory=lambda: [32, 64, 128, 256])

    @model_validator(mode="after")
    def _sorted_positive(self) -> CudaGraphBuckets:
        for name in ("batch_buckets", "seq_buckets"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values) or values != sorted(set(values)):
                raise ValueError(f"{name} must be positive, ascending and unique, got {values}")
        return self


class TorchOptions(BaseModel):
    """`parameters.torch` of a variant whose backend is `torch`."""

    model_config = STRICT

    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    cuda_graphs: CudaGraphBuckets | None = None
    compile: bool = False
    tokenizer_threads: int = Field(default=2, ge=1, le=64)


# The keys of `parameters` one encoder engine reads beside EncoderParameters' own: ONNX
# Runtime's `providers`, PyTorch's `torch` (TorchOptions), TensorRT's build and device settings
# (workers/engines/tensorrt_engine.py; tests/test_encoder_parameters.py keeps them all here).
# A variant reads its model's parameters merged with its own, so its sibling engines' pass.
ENGINE_SETTINGS = frozenset(
    {
        "providers",
        "torch",
        "precision",
        "max_batch",
        "opt_batch",
        "opt_seq",
        "workspace_mib",
        "calibration_file",
        "calibration_batch",
        "device_id",
        "engine_cache_dir",
    }
)


class EncoderParameters(BaseModel):
    """The `parameters` every encoder engine reads (unset: the engine's default), checked when
    the repository loads: a negative `max_seq_length` used to stop the worker inside the
    tokenizer. Other keys must belong to one encoder engine (ENGINE_SETTINGS): a typo such as
    `max_seq_lenght` served at the default length, silently."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    # strict, as GenerateParameters: `true` read as 1 and "8" as 8
    # 2 at least: a tokenizer cannot cut below its two special tokens, and at 1 cut nothing
    max_seq_length: int = Field(default=DEFAULT_MAX_SEQ_LENGTH, ge=2, strict=True)
    max_texts_per_call: int | None = Field(default=None, ge=1, strict=True)
    # 0: the runtime's own, or the CPUs this worker may use where a CPU limit or mask narrows it
    intra_op_threads: int = Field(default=0, ge=0, le=MAX_INTRA_OP_THREADS, strict=True)

    @model_validator(mode="after")
    def _known(self) -> EncoderParameters:
        unknown = sorted(set(self.model_extra or {}) - ENGINE_SETTINGS)
        if unknown:
            known = sorted({*EncoderParameters.model_fields, *ENGINE_SETTINGS})
            raise ValueError(
                f"{', '.join(map(repr, unknown))} is read by no encoder engine (onnxruntime, "
                f"tensorrt, torch); they read {', '.join(known)}"
            )
        return self


# The most tokens a generate model's limit or default may name: shared/backlog.py estimates a
# job's work by them as a float, which past 2**53 no longer holds every count, and past ~1.8e308
# raised OverflowError wherever the partition's backlog was read. No context is near it.
MAX_TOKENS = 2**53


class GenerateParameters(BaseModel):
    """The `parameters` of a generate model that Conveyor reads itself (the producer, the
    worker's loop, vLLM's cap), checked when the repository loads: PyYAML read `1e3` as a
    string, and the producer answered 500 to every request naming a `max_tokens` while the
    worker failed every job. Every other key is the engine's own, and passes."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    max_tokens_limit: int | None = Field(default=None, ge=1, le=MAX_TOKENS, strict=True)
    default_max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS, strict=True)

    def default_past_limit(self) -> str | None:
        """Why the default is refused, if it is past the limit: the producer refuses a job's own
        max_tokens past it (422), as vLLM refuses one past the context, and a job that named
        none ran cut short at the limit, estimated uncut by shared/backlog.py."""
        limit, default = self.max_tokens_limit, self.default_max_tokens
        if limit is None or default is None or default <= limit:
            return None
        return (
            f"parameters.default_max_tokens ({default}) must be at most "
            f"parameters.max_tokens_limit ({limit}): a job naming max_tokens {default} is refused"
        )


# The shortest `queue.max_run_s` but 0 (no ceiling): the ceiling is for a wedged engine, and
# under a second it deemed hung an engine call as ordinary as a CPU micro-batch of an encoder,
# a long prompt's prefill, a bisection's reruns or a staged engine's wait for the device.
MIN_RUN_CEILING_S = 1.0


class QueueLimits(BaseModel):
    model_config = STRICT

    max_length: int = Field(default=10_000, ge=1)
    max_queue_time_s: float = Field(default=600.0, gt=0, le=YEAR_S)
    visibility_timeout_s: float = Field(default=60.0, gt=0, le=YEAR_S)
    max_deliveries: int = Field(default=3, ge=1)
    # Longest one micro-batch may run on the engine (a bisection's reruns and a staged engine's
    # wait for the device included), or a generate model's engine may go without a step (no
    # chunk, no generation ended) while it has generations, before the engine is deemed hung (a
    # wedged kernel, a deadlocked library, vLLM's engine core wedged): its entries are no longer
    # re-claimed and the worker exits, as for a dead engine. 0: no ceiling (else, in a
    # config.yaml, MIN_RUN_CEILING_S at least).
    max_run_s: float = Field(default=600.0, ge=0, le=YEAR_S)
    # Refuse at submit (429 deadline_unmeetable) a job whose deadline, or whose enqueue plus
    # max_queue_time_s, falls before its ETA, rather than accept it and let it expire
    # (shared/queue_eta.py).
    admit_by_deadline: bool = False
    # Serve tenants by weighted deficit round robin instead of in arrival order: once the lane's
    # stream holds `fair_window` undelivered entries (default: max_batch_size), new jobs are held
    # per tenant and moved in by weight as reads take them (docs/architecture.md, "Fair
    # queuing"). Off by default: held jobs are not in the stream, so KEDA's streamLength
    # trigger does not see them.
    fair: bool = False
    fair_window: int | None = Field(default=None, ge=1)
    # While a fair lane's round robin serves more than one tenant, micro-batches are sized so an
    # engine call takes about this long (workers/batching/batch_budget.py): a micro-batch is not
    # preempted, and a quiet tenant's job waits for the one in hand. None: full micro-batches.
    # Read by the worker, which follows the held jobs it is handed, whatever its `fair` says.
    fair_batch_ms: float | None = Field(default=None, gt=0, le=YEAR_S * 1000)

    @field_validator("visibility_timeout_s")
    @classmethod
    def _xautoclaim_can_wait(cls, visibility_timeout_s: float) -> float:
        """XAUTOCLAIM's idle time is whole milliseconds (workers/partition/reclaim.py cuts it):
        under 1 ms it is 0, which claims every entry the moment it is read, jobs still running
        included, and runs them again until they are dead-lettered."""
        if visibility_timeout_s < 0.001:
            raise ValueError(
                f"{visibility_timeout_s:g} is below 0.001: a reclaim's idle time is whole "
                "milliseconds, and this one would be 0 (every job in hand claimed again at once)"
            )
        return visibility_timeout_s


class BacklogScaling(BaseModel):
    """`autoscaling.backlog`: how a pool scaled on seconds of backlog (shared/backlog.py) is
    targeted and read by KEDA."""

    model_config = STRICT

    # Seconds of queued work one replica should have: the HPA's AverageValue target.
    target_s: float = Field(default=30.0, gt=0, le=YEAR_S)
    # One replica's seconds per job (batch) or per completion token (generate) until a worker
    # has measured it.
    cost_estimate_s: float = Field(default=0.05, gt=0, le=YEAR_S)
    scaler: Literal["metrics-api", "prometheus"] = "metrics-api"

    @field_validator("target_s")
    @classmethod
    def _keda_can_send(cls, target_s: float) -> float:
        """KEDA hands the HPA a target in whole thousandths: cut (`int64(v * 1000)`) before
        2.20, rounded (`%.3f`, kedacore/keda#7534) since. Under 1 ms the cut is 0, which the HPA
        refuses. Under 10 ms one thousandth is over the HPA's 10 % tolerance of the target: one
        between two (0.0015, sent as 0.001 or 0.002 by version) scaled a third or half off its
        config, so there it must be whole thousandths, which both versions send as written."""
        if target_s < 0.001:
            raise ValueError(
                f"{target_s:g} is below 0.001: KEDA sends the HPA 0.001 s at least (a target "
                "in whole thousandths), and KEDA before 2.20 would send this one as 0"
            )
        if target_s < 0.01 and round(target_s, 3) != target_s:
            raise ValueError(
                f"{target_s:g} is not a whole number of thousandths: KEDA sends the HPA "
                f"{int(target_s * 1000) / 1000:g} before 2.20 (cut) and {round(target_s, 3):g} "
                "since (rounded), and one thousandth is over a tenth of a target under 0.01 s"
            )
        return target_s


class AutoscalingHints(BaseModel):
    model_config = STRICT

    # What the pool scales on: entries in its streams, or seconds of work they hold.
    metric: Literal["stream_length", "backlog_seconds"] = "stream_length"
    backlog: BacklogScaling = Field(default_factory=BacklogScaling)
    lag_per_replica: int = Field(default=32, ge=1)
    activation_lag: int = Field(default=0, ge=0, le=MAX_KEDA_COUNT)
    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=4, ge=1, le=MAX_REPLICAS)
    cooldown_s: int = Field(default=120, ge=0, le=YEAR_S)
    polling_interval_s: int = Field(default=5, ge=1, le=YEAR_S)
    # Longest one micro-batch (or, for generate models, one whole generation) may run: a
    # worker's drain timeout and the pod's termination grace period must both exceed it.
    slowest_batch_s: float = Field(default=30.0, gt=0, le=YEAR_S)

    @field_validator("lag_per_replica")
    @classmethod
    def _hpa_can_read(cls, lag_per_replica: int) -> int:
        """KEDA hands `streamLength` to the HPA as its target, which the HPA reads in
        thousandths as an int64: past MAX_HPA_TARGET that wraps, silently."""
        if lag_per_replica > MAX_HPA_TARGET:
            raise ValueError(
                f"{lag_per_replica} is above {MAX_HPA_TARGET}: the HPA reads this target in "
                "thousandths as an int64, which it would overflow (the pool would scale on a "
                "wrapped target)"
            )
        return lag_per_replica

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingHints:
        """KEDA refuses a ScaledObject whose minimum exceeds its maximum."""
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self


def quote(value: Any) -> str:
    """A refused value as a 422 quotes it: its JSON, cut at QUOTED_CHARS with its length (a
    refused 16 KB prompt or variant name was quoted whole)."""
    quoted = _as_json(value)
    if len(quoted) <= QUOTED_CHARS:
        return quoted
    return f"{quoted[:QUOTED_CHARS]}… ({len(quoted)} characters of JSON)"


def client_named(part: str | int) -> str:
    """A value the client sent, named in an error as sent (a field's name, a list's index, a
    key of its own, a header, a query value, an id), quoted cut short when long (an unknown
    field or a route's variant named in 100 KB was quoted whole)."""
    text = str(part)
    return text if len(text) <= QUOTED_CHARS else quote(text)


def _as_json(value: Any) -> str:
    """The value's JSON by orjson, else by the standard library: orjson refuses an integer past
    64 bits (a typo's in a config.yaml), and its refusal escaped as a TypeError traceback."""
    try:
        return dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)


def _briefly(error: jsonschema_rs.ValidationError) -> str:
    """The error's message with the value it quotes cut short, once for every way it broke
    the schema. An unexpected key (or item) is named in the message, not as its instance, and
    a key refused by `propertyNames` only in the key's own error: each came back whole."""
    match error.kind:
        case jsonschema_rs.ValidationErrorKind.PropertyNames(error=own):
            return _briefly(own)
        case (
            jsonschema_rs.ValidationErrorKind.AdditionalProperties(unexpected=unexpected)
            | jsonschema_rs.ValidationErrorKind.UnevaluatedProperties(unexpected=unexpected)
            | jsonschema_rs.ValidationErrorKind.UnevaluatedItems(unexpected=unexpected)
        ):
            named = ", ".join(f"'{name}'" for name in unexpected)
            return _cut(error.message, named, unexpected)
    return _cut(error.message, _as_json(error.instance), error.instance)


def _cut(message: str, said: str, value: Any) -> str:
    """`message` with `said`, how it quotes `value`, cut short where long."""
    if len(said) <= QUOTED_CHARS or said not in message:
        return message
    return message.replace(said, quote(value), 1)


class InputProblem(NamedTuple):
    """One way a job's `inputs` break the model's schema: where (keys and indexes), and how."""

    path: tuple[str | int, ...]
    why: str


def in_inputs(path: Sequence[str | int]) -> str:
    """A place in a job's inputs as `/v1/jobs` refusals name it: `inputs['messages'][0]`; a key
    of the client's own (under `additionalProperties: {...}`) quoted cut short where long."""
    return "inputs" + "".join(
        f"[{p!r}]" if len(str(p)) <= QUOTED_CHARS else f"[{quote(p)}]" for p in path
    )


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"remote $ref {uri!r}: input schemas must be self-contained")


class ModelConfig(BaseModel):
    """One model: what engine runs it, what it accepts, how it batches, queues and scales."""

    model_config = ConfigDict(**STRICT, protected_namespaces=())

    name: str
    kind: Literal["batch", "generate"]
    # What the model does for the OpenAI-compatible routes: `embed` serves `/v1/embeddings`
    # (inputs `{texts, encoding_format}`, outputs `{embeddings, usage}`), like vLLM's `--task`.
    task: Literal["embed"] | None = None
    backend: str
    artifact: str | None = None
    prepare: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    parameters: dict[str, Any] = Field(default_factory=dict)
    max_batch_size: int = Field(default=32, ge=1, le=MAX_JOBS_PER_READ)
    max_queue_delay_ms: float = Field(default=2.0, ge=0, le=60_000)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_num_seqs: int = Field(default=16, ge=1, le=MAX_JOBS_PER_READ)
    bulk_share: float = Field(default=0.2, ge=0.0, le=1.0)
    queue: QueueLimits = Field(default_factory=QueueLimits)
    variants: dict[str, Variant] = Field(default_factory=lambda: {"default": Variant()})
    default_variant: str = "default"
    autoscaling: AutoscalingHints = Field(default_factory=AutoscalingHints)
    directory: Path = Path()

    @field_validator("artifact")
    @classmethod
    def _inside_artifact_folder(cls, artifact: str | None) -> str | None:
        """The engines read it, and `conveyor models prepare` writes it, at the model's artifact
        folder joined with it: an absolute path or a `..` led out of that folder, and prepare
        wrote the ONNX graph there (another model's folder, any file the CLI may write). `.`
        named the folder itself, which no engine loads and prepare could not write over."""
        path = Path(artifact or "")
        if path.is_absolute() or ".." in path.parts or (artifact and not path.parts):
            raise ValueError(
                f"{artifact!r} is not a file inside the model's artifact folder "
                "(CONVEYOR_ARTIFACT_DIR/<model>): name it relative to that folder, without `..`"
            )
        return artifact

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        for name in [self.name, *self.variants]:
            if not NAME_PATTERN.fullmatch(name):  # `$` alone matches before a final newline
                raise ModelConfigError(f"{name!r} is not a valid model or variant name")
        self._check_json_values()
        if self.default_variant not in self.variants:
            raise ModelConfigError(
                f"model {self.name}: default_variant {self.default_variant!r} is not a variant"
            )
        if self.variants[self.default_variant].shadow:  # shared/routing.py's seed_routes
            raise ModelConfigError(
                f"model {self.name}: default_variant {self.default_variant!r} is a shadow "
                "(`shadow: true`), which takes only copies: the default variant serves every "
                "request naming none while no variant has weight, and is a canary's baseline"
            )
        if self.task == "embed" and self.kind != "batch":
            raise ModelConfigError(f"model {self.name}: task embed needs kind batch")
        if (
            self.kind == "batch"
            and self.max_queue_delay_ms >= self.queue.visibility_timeout_s * 1000
        ):
            # workers/partition/stream_reader.py's gather touches no entry it holds
            raise ModelConfigError(
                f"model {self.name}: max_queue_delay_ms ({self.max_queue_delay_ms:g}) must be "
                f"below queue.visibility_timeout_s ({self.queue.visibility_timeout_s:g} s): a "
                "micro-batch's first job waits that long, untouched, while it gathers, and "
                "another worker's reclaimer takes it to run again"
            )
        try:  # jsonschema's own error is a many-line dump, and no ValueError pydantic reports
            # No format checks: its `regex` one is Python's `re`, which refused ECMA-262 patterns
            # (`\p{L}`, named groups `(?<name>...)`) the compiled check takes; that compiles them.
            Draft202012Validator.check_schema(self.input_schema, format_checker=None)
        except SchemaError as exc:
            where = exc.json_path.replace("$", "input_schema", 1)
            raise ModelConfigError(f"model {self.name}: {where}: {exc.message}") from None
        try:
            self.input_check  # noqa: B018 - compiled once, at load: a schema it refuses is an error here
        except jsonschema_rs.ValidationError as exc:  # a pattern no ECMA-262 engine compiles
            where = "".join(f".{part}" for part in exc.instance_path)
            raise ModelConfigError(
                f"model {self.name}: input_schema{where}: {exc.message}"
            ) from None
        except ValueError as exc:
            raise ModelConfigError(f"model {self.name}: input_schema: {exc}") from exc
        types = self.input_schema.get("type")
        if types is not None and "object" not in ([types] if isinstance(types, str) else types):
            raise ModelConfigError(  # JobRequest.inputs, producer_api/jobs/protocol.py
                f"model {self.name}: input_schema.type: a job's inputs are a JSON object, which "
                f"type {quote(types)} refuses: every submit would be refused (422)"
            )
        if self.task == "embed":
            self._check_embed_inputs()
        if self.prepare is not None and self.prepare not in PREPARER_NAMES:
            raise ModelConfigError(
                f"model {self.name}: unknown preparer {self.prepare!r}; one of "
                f"{', '.join(sorted(PREPARER_NAMES))}"
            )
        for variant in self.variants:
            self._check_variant(variant)
        return self

    def _check_json_values(self) -> None:
        """Its free-form values (input_schema, each `parameters`) are JSON's, as what else holds
        them sees them: engines take parameters as loaded, and a NaN, an infinity or a date
        reached engines that check none of them."""
        places = [
            (f"model {self.name}", "input_schema", self.input_schema),
            (f"model {self.name}", "parameters", self.parameters),
        ]
        places += [
            (f"model {self.name} variant {name}", "parameters", variant.parameters)
            for name, variant in self.variants.items()
        ]
        for owner, where, value in places:
            if (problem := _not_json(value, where)) is not None:
                raise ModelConfigError(f"{owner}: {problem}")

    def _check_embed_inputs(self) -> None:
        """/v1/embeddings submits `{texts, encoding_format}` (producer_api/openai/protocol.py):
        a schema that refuses them answers every call 422."""
        errors = self.input_errors(EMBED_INPUTS)
        if errors:
            raise ModelConfigError(
                f"model {self.name}: task embed needs an input_schema that accepts "
                f"/v1/embeddings' inputs {{texts, encoding_format}}: {'; '.join(errors)}"
            )

    def _check_variant(self, variant: str) -> None:
        backend = self.backend_of(variant)
        if backend not in BACKEND_NAMES and not CUSTOM_BACKEND.fullmatch(backend):
            raise ModelConfigError(
                f"model {self.name} variant {variant}: unknown backend {backend!r}; one of "
                f"{', '.join(sorted(BACKEND_NAMES))}, or a custom engine's `package.module:Class`"
            )
        serves = "generate" if backend in GENERATE_BACKENDS else "batch"
        if backend in BACKEND_NAMES and serves != self.kind:  # a custom one: when a worker has it
            raise ModelConfigError(
                f"model {self.name} variant {variant}: backend {backend} serves kind {serves}, "
                f"not {self.kind}"
            )
        built = PREPARED_KINDS.get(self.prepare or "", self.kind)
        if backend in ARTIFACT_BACKENDS and built != self.kind:  # a custom one reads what it will
            raise ModelConfigError(
                f"model {self.name} variant {variant}: `prepare: {self.prepare}` builds a "
                f"{built} model, which backend {backend} (kind {self.kind}) cannot load"
            )
        sizes = self.preferred_batch_sizes_of(variant)
        largest = self.max_batch_size_of(variant)
        if any(not 1 <= size <= largest for size in sizes):
            raise ModelConfigError(
                f"model {self.name} variant {variant}: preferred_batch_sizes {sizes} must lie in "
                f"1..max_batch_size ({largest})"
            )
        if backend in GENERATE_BACKENDS and "max_num_seqs" in self.variant_parameters(variant):
            raise ModelConfigError(  # the engine would take it, the worker's loop never reads it
                f"model {self.name} variant {variant}: parameters.max_num_seqs: set the model's "
                "top-level max_num_seqs instead (the worker reads it, and passes it to vLLM)"
            )
        if backend in GENERATE_BACKENDS and (
            replaced := VLLM_ARTIFACT_ARGS.intersection(self.variant_parameters(variant))
        ):
            raise ModelConfigError(  # workers/engines/vllm_engine.py: prompt_token_ids
                f"model {self.name} variant {variant}: parameters.{min(replaced)}: the worker "
                "serves the model in its artifact folder (CONVEYOR_ARTIFACT_DIR/<model>) and "
                "tokenises prompts with that folder's tokenizer; vLLM given another would be fed "
                "its ids"
            )
        if self.kind == "generate":  # a custom engine's too: the producer and the loop read them
            try:
                parameters = GenerateParameters.model_validate(self.variant_parameters(variant))
            except ValidationError as exc:
                problems = _problems(exc, within="parameters")
                raise ModelConfigError(f"model {self.name} variant {variant}: {problems}") from None
            if (why := parameters.default_past_limit()) is not None:
                raise ModelConfigError(f"model {self.name} variant {variant}: {why}")
        if backend in ENCODER_BACKENDS:
            self._check_encoder(variant, backend)

    def _check_encoder(self, variant: str, backend: str) -> None:
        """A length past the prepared model's positions fails every engine's load (a worker
        crash loop while the producer queues jobs): refused here, as a seq bucket past them."""
        longest = self.encoder_parameters(variant).max_seq_length
        positions = PREPARED_POSITIONS.get(self.prepare or "")
        if positions is not None and longest > positions:
            raise ModelConfigError(
                f"model {self.name} variant {variant}: max_seq_length {longest} exceeds the "
                f"{positions} positions of the model `prepare: {self.prepare}` builds"
            )
        if backend != "torch":
            return
        buckets = self.torch_options(variant).cuda_graphs
        if buckets is None:
            return
        if longest > buckets.seq_buckets[-1]:
            raise ModelConfigError(
                f"model {self.name} variant {variant}: max_seq_length {longest} exceeds the "
                f"largest of parameters.torch.cuda_graphs.seq_buckets ({buckets.seq_buckets[-1]})"
            )
        if positions is not None and buckets.seq_buckets[-1] > positions:
            raise ModelConfigError(
                f"model {self.name} variant {variant}: parameters.torch.cuda_graphs.seq_buckets "
                f"{buckets.seq_buckets} exceed the {positions} positions of the model "
                f"`prepare: {self.prepare}` builds"
            )

    @cached_property
    def input_check(self) -> jsonschema_rs.Draft202012Validator:
        """The schema compiled (Rust, draft 2020-12, ECMA-262 patterns), what every submit is
        checked and every refusal explained with. A remote `$ref` is refused, not fetched."""
        return jsonschema_rs.Draft202012Validator(self.input_schema, retriever=_no_retrieval)

    def input_problems(self, inputs: Any) -> list[InputProblem]:
        """Every way `inputs` breaks the schema (none when valid), in the order of their places.
        Not explained by Python's jsonschema: its `re` backtracks, and one refused text took
        hours on the producer's event loop over a pattern as plain as `^([a-z]+ ?)*$` (and it
        found nothing wrong where the two engines differ, as `$` before a final newline)."""
        if self.input_check.is_valid(inputs):
            return []
        errors = sorted(self.input_check.iter_errors(inputs), key=lambda e: list(e.instance_path))
        return [InputProblem(tuple(e.instance_path), _briefly(e)) for e in errors]

    def input_errors(self, inputs: Any) -> list[str]:
        """Readable messages for every way `inputs` breaks the schema (empty when valid)."""
        return [f"{in_inputs(p.path)}: {p.why}" for p in self.input_problems(inputs)]

    def fair_window_of(self, variant: str) -> int:
        """Undelivered entries a lane's stream may hold before jobs are held for fair queuing;
        0 when the model does not queue fairly."""
        if not self.queue.fair:
            return 0
        return self.queue.fair_window or self.max_batch_size_of(variant)

    def unnamed_max_tokens_of(self, variant: str) -> int:
        return unnamed_max_tokens(self.variant_parameters(variant))

    def max_batch_size_of(self, variant: str) -> int:
        """The variant's own maximum, else the model's (a variant the config lacks: the model's)."""
        own = self.variants.get(variant)
        return (own.max_batch_size if own else None) or self.max_batch_size

    def variant_parameters(self, variant: str) -> dict[str, Any]:
        return {**self.parameters, **self.variants[variant].parameters}

    def backend_of(self, variant: str) -> str:
        return self.variants[variant].backend or self.backend

    def preferred_batch_sizes_of(self, variant: str) -> list[int]:
        """Ascending micro-batch sizes the batcher stops gathering at when the queue is shallow
        (Triton's `preferred_batch_size`): sizes that fill an engine's shape bucket."""
        own = self.variants[variant].preferred_batch_sizes
        return sorted(set(self.preferred_batch_sizes if own is None else own))

    def encoder_parameters(self, variant: str) -> EncoderParameters:
        try:
            return EncoderParameters.model_validate(self.variant_parameters(variant))
        except ValidationError as exc:
            problems = _problems(exc, within="parameters")
            raise ModelConfigError(f"model {self.name} variant {variant}: {problems}") from None

    def torch_options(self, variant: str) -> TorchOptions:
        try:
            return TorchOptions.model_validate(self.variant_parameters(variant).get("torch") or {})
        except ValidationError as exc:
            raise ModelConfigError(
                f"model {self.name} variant {variant}: parameters.torch: {_problems(exc)}"
            ) from None


def _not_json(value: Any, where: str) -> str | None:
    """Why `value`, at `where` (dotted, as pydantic's places), has no JSON value, if it has none:
    a number that is not finite (YAML's `.nan`, `.inf`, a `1e400`), a key that is no string, or
    any other type (a YAML timestamp's date; a set or bytes of a config built in code)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where}: key {quote(key)} {NOT_A_STRING_KEY}"
            if (problem := _not_json(item, f"{where}.{key}")) is not None:
                return problem
        return None
    if isinstance(value, list):
        problems = (_not_json(item, f"{where}.{index}") for index, item in enumerate(value))
        return next((problem for problem in problems if problem is not None), None)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value} is not a finite number (JSON has no NaN or infinity)"
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return None
    return f"{where}: a {type(value).__name__} ({value}) has no JSON value (quote it for a string)"


def _problems(exc: ValidationError, within: str = "") -> str:
    """pydantic's errors on one line, each at its dotted location (`within`: the object's own
    place, before each field's; an error of the whole object has none of its own); our own
    checks' messages without pydantic's `Value error, `. A value of the wrong type is quoted as
    YAML read it: `max_batch_size: yes` is `true`, not the integer its author meant."""

    def problem(error: Any) -> str:
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = list(error["loc"])
        if loc[-1:] == [DICT_KEY]:
            # a mapping's key of another type: pydantic places it at the key itself, as an
            # integer (`parameters: {on: 1}` read as `parameters.1.[key]`), a place not in the file
            loc, message = loc[:-2], f"key {quote(error['input'])} {NOT_A_STRING_KEY}"
        elif str(error["type"]).endswith("_type"):
            message = f"{message}, not {quote(error['input'])}"
        where = ".".join(map(str, [within, *loc] if within else loc))
        return f"{where}: {message}" if where else message

    return "; ".join(problem(error) for error in exc.errors())


MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`'s key


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's (and JSON's) exponents: YAML 1.1 reads `1e3` and
    `1.0e3` as strings (it wants `1.0e+3`), which strict numbers refuse. A key given twice in
    one mapping is refused, as YAML says it must be: PyYAML kept the last, silently, and the
    first (perhaps the one its author meant) was ignored."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._refuse_duplicate_keys(node)
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, root: yaml.Node) -> None:
        """Checked on the composed nodes, before construction flattens merge keys into the
        mappings that name them (a key set beside a merge overrides it). Each node once: aliases
        share nodes, and one inside what it names is a cycle (refused later, by _ExpandedSize)."""
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen or isinstance(node, yaml.ScalarNode):
                continue
            seen.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                stack.extend(node.value)
                continue
            keys: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                stack += [key_node, value_node]
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == MERGE_TAG:
                    continue
                first = keys.setdefault(self.construct_object(key_node), key_node)
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        problem=f"key {self.construct_object(key_node)!r} given twice (first on "
                        f"line {first.start_mark.line + 1})",
                        problem_mark=key_node.start_mark,
                    )


def _no_json_value(loader: yaml.SafeLoader, node: yaml.Node) -> NoReturn:
    """A config's values are JSON's (an input schema, engine parameters, a refused value quoted
    as JSON): a `!!set` or `!!binary` escaped as a TypeError traceback where one was quoted."""
    raise yaml.constructor.ConstructorError(
        problem=f"a !!{node.tag.rpartition(':')[2]} has no JSON value", problem_mark=node.start_mark
    )


_ConfigLoader.add_constructor("tag:yaml.org,2002:set", _no_json_value)
_ConfigLoader.add_constructor("tag:yaml.org,2002:binary", _no_json_value)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _settings(config_path: Path) -> dict[str, Any]:
    """A config.yaml's mapping; what is not one is refused in one line that names the file."""
    try:
        with config_path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:  # unreadable, or a folder named config.yaml
        raise ModelConfigError(f"{config_path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelConfigError(f"{config_path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        raw = yaml.load(_utf8(data), Loader=_ConfigLoader)
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"{config_path}: not YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise _too_deep(config_path) from None
    if raw is None:  # read as `{}` (as was `[]`, `0` or `''`), it was refused for missing `kind`
        raise ModelConfigError(f"{config_path}: empty, no settings")
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{config_path}: not a mapping of settings")
    _ExpandedSize(config_path).of(raw, 0)
    return raw


def _utf8(data: bytes) -> str:
    """The file's text, decoded here rather than by PyYAML: given bytes, it read a UTF-16 file
    by its byte order mark, which loaded. One that is not UTF-8 (a UTF-8 mark, which YAML
    allows, aside) is refused as PyYAML refuses a bad UTF-8 byte, at the first that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"{exc.reason} (not UTF-8)"
        where = exc.start
        raise yaml.reader.ReaderError(
            "<byte string>", where, data[where], "utf-8", reason
        ) from None


def _too_deep(config_path: Path) -> ModelConfigError:
    return ModelConfigError(f"{config_path}: nested deeper than {MAX_CONFIG_DEPTH} levels")


class _ExpandedSize:
    """Counts a loaded config's values as its readers see them, aliases expanded, each shared
    collection once. PyYAML shares one object wherever an alias names it: a few hundred bytes
    of nested aliases (a billion laughs) are 10^9 values where the input schema is compiled,
    which took every producer and worker down for memory, and an alias inside the collection
    it names is a cycle that no reader's recursion ends (a RecursionError traceback)."""

    def __init__(self, config_path: Path) -> None:
        self.config_path = config_path
        self.sizes: dict[int, int | None] = {}  # None: being counted (met again: a cycle)

    def of(self, value: Any, depth: int) -> int:
        if not isinstance(value, dict | list):
            return 1
        if id(value) in self.sizes:
            size = self.sizes[id(value)]
            if size is None:
                raise ModelConfigError(f"{self.config_path}: an alias names a collection it is in")
            return size
        if depth >= MAX_CONFIG_DEPTH:
            raise _too_deep(self.config_path)
        self.sizes[id(value)] = None
        children = value.values() if isinstance(value, dict) else value
        size = 1 + sum(self.of(child, depth + 1) for child in children)
        if size > MAX_CONFIG_VALUES:
            raise ModelConfigError(
                f"{self.config_path}: more than {MAX_CONFIG_VALUES} values, its aliases expanded"
            )
        self.sizes[id(value)] = size
        return size


def _config_paths(root: Path) -> list[Path]:
    """Each model folder's config.yaml. A folder named as a model may be without one is
    refused, as Triton refuses a model folder without its config.pbtxt: a `config.yml` or
    `Config.yaml` left its model unserved, silently. A folder named `.…` or `_…` is no model,
    nor one without a config.yaml that no model could be named (a volume's `lost+found`)."""
    try:
        folders = sorted(path for path in root.iterdir() if not path.name.startswith((".", "_")))
    except OSError as exc:
        raise ModelConfigError(f"model repository {root}: cannot read: {exc.strerror}") from None
    paths = []
    for folder in folders:
        if not folder.is_dir():
            _refuse_broken_link(folder)
            continue
        config_path = folder / "config.yaml"
        if config_path.exists() or config_path.is_symlink():  # a broken link: unreadable
            paths.append(config_path)
        elif NAME_PATTERN.fullmatch(folder.name):
            raise ModelConfigError(
                f"{folder}: no config.yaml; each folder of a model repository is a model's"
            )
    return paths


def _refuse_broken_link(path: Path) -> None:
    """A link named as a model may be that leads to no folder (nothing, or itself) is refused,
    as a broken link for config.yaml is: a model linked in from a volume not mounted went
    unserved, silently."""
    if path.is_symlink() and not path.exists() and NAME_PATTERN.fullmatch(path.name):
        raise ModelConfigError(f"{path}: cannot read: a link to no folder ({path.readlink()})")


def _check_queue_time(config_path: Path, queue: QueueLimits, result_ttl_s: int) -> None:
    """A job's hash gets the result TTL at enqueue and is renewed only once the job ended
    (shared/job_store.py): a job allowed to wait that long lost its hash while queued (a 404
    for a queued job, which the worker then skipped as missing)."""
    if queue.max_queue_time_s >= result_ttl_s:
        raise ModelConfigError(
            f"{config_path}: queue.max_queue_time_s ({queue.max_queue_time_s} s) must be below "
            f"CONVEYOR_RESULT_TTL_S ({result_ttl_s} s): a job's hash expires that long after it "
            "was enqueued, even while it waits"
        )


def _check_run_ceiling(config_path: Path, config: ModelConfig) -> None:
    """Past `queue.max_run_s` an engine is deemed hung and its worker exits, its jobs left to run
    again elsewhere: under MIN_RUN_CEILING_S an ordinary engine call was (at 0.0001 s, every
    one run off the event loop, the worker exiting at its first micro-batch, restart after
    restart). Checked where a config.yaml is read, as the result TTL is: a config built in
    code (a test of the watch) may set a shorter ceiling."""
    max_run_s = config.queue.max_run_s
    if 0 < max_run_s < MIN_RUN_CEILING_S:
        raise ModelConfigError(
            f"{config_path}: model {config.name}: queue.max_run_s ({max_run_s:g} s) must be 0 "
            f"(no ceiling) or at least {MIN_RUN_CEILING_S:g} s: past it an engine call is deemed "
            "hung and the worker exits"
        )


def _warn_stranded_jobs(config_path: Path, config: ModelConfig) -> None:
    """At zero replicas KEDA (and `conveyor autoscale`) wakes a pool only once a lane holds more
    than `activation_lag` entries: fewer wait for company, however long. KEDA's documented
    trade-off, so said at every load rather than refused (the config loaded silently)."""
    hints = config.autoscaling
    if hints.metric == "stream_length" and hints.activation_lag > 0 and hints.min_replicas == 0:
        log.warning(
            "%s: model %s: autoscaling.activation_lag is %d with min_replicas 0: at zero "
            "replicas up to %d jobs per lane wait for more to arrive, however long (until their "
            "record expires); set min_replicas to 1 or activation_lag to 0 if they must not",
            config_path,
            config.name,
            hints.activation_lag,
            hints.activation_lag,
        )


class ModelRepository:
    """All models under one folder, discovered by walking it (like Triton's repository)."""

    def __init__(self, models: dict[str, ModelConfig]) -> None:
        self.models = models

    @classmethod
    def load(cls, root: Path, result_ttl_s: int | None = None) -> ModelRepository:
        """Every `<model>/config.yaml` under `root`. An empty folder is an empty repository, but a
        missing one is an error: a mistyped path would otherwise serve nothing, silently. A queue
        wait the result TTL does not cover is an error too, for every loader: `result_ttl_s` is
        that of a caller's own Settings, else this process's CONVEYOR_RESULT_TTL_S. Checked only
        where callers passed it, `conveyor up` started a stack its producer then refused."""
        if result_ttl_s is None:
            result_ttl_s = get_settings().result_ttl_s
        if not root.is_dir():
            raise ModelConfigError(f"model repository {root} is not a directory")
        models: dict[str, ModelConfig] = {}
        for config_path in _config_paths(root):
            raw = _settings(config_path)
            if "directory" in raw:  # the loader's to set, not a setting: it was replaced, silently
                raise ModelConfigError(f"{config_path}: directory: Extra inputs are not permitted")
            raw.setdefault("name", config_path.parent.name)
            try:
                config = ModelConfig.model_validate({**raw, "directory": config_path.parent})
            except ValidationError as exc:
                raise ModelConfigError(f"{config_path}: {_problems(exc)}") from None
            if config.name != config_path.parent.name:
                raise ModelConfigError(
                    f"{config_path}: name {config.name!r} must match its folder's"
                )
            _check_queue_time(config_path, config.queue, result_ttl_s)
            _check_run_ceiling(config_path, config)
            _warn_stranded_jobs(config_path, config)
            models[config.name] = config
        return cls(models)

    def get(self, name: str) -> ModelConfig | None:
        return self.models.get(name)

    def __iter__(self) -> Iterator[ModelConfig]:
        return iter(self.models.values())

    def partitions(self, selectors: list[str]) -> list[tuple[ModelConfig, str]]:
        """Resolve `model` (all its variants) or `model:variant` selectors to partitions."""
        chosen: list[tuple[ModelConfig, str]] = []
        for selector in selectors:
            name, _, variant = selector.partition(":")
            config = self.models.get(name)
            if config is None:
                known = ", ".join(self.models)
                raise ModelConfigError(f"unknown model {name!r} (the repository has {known})")
            if variant and variant not in config.variants:
                raise ModelConfigError(f"model {name} has no variant {variant!r}")
            chosen.extend((config, v) for v in ([variant] if variant else config.variants))
        return chosen
