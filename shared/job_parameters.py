"""A job's parameters as the producers check them at submit, here so that a dead letter's replay
checks them as today's submit would (`shared.dead_letters.submit_checks`): a generate model's
sampling parameters within vLLM's bounds and the model's limits, none for a batch model but
an embed model's `truncate`. A refusal is a `ParametersRefused`, which the producer answers
as a 422."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictBool, Tag, ValidationError

from shared.json_unions import AS_SENT, BY_JSON_TYPE
from shared.model_repository import (
    GENERATE_BACKENDS,
    ModelConfig,
    client_named,
    in_inputs,
    unnamed_max_tokens,
)


class ParametersRefused(Exception):
    """Why a job's parameters are refused (`message`), and the field refused (`param`, as the
    client sent it) where the refusal names one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class FieldNames:
    """How a refusal names a job's fields: as `/v1/jobs` takes them (`parameters.max_tokens`,
    `inputs['prompt']`). An OpenAI route's request names them as its client sent them
    (`producer_api.openai.protocol.SentNames`), so its 400 names a field it sent."""

    def parameter(self, name: str) -> str:
        """A parameter as a message cites it."""
        return name

    def where(self, name: str) -> str:
        """Where a parameter is in the body: the refusal's `param`."""
        return f"parameters.{self.parameter(name)}"

    def input(self, path: Sequence[str | int]) -> str:
        """A place in the job's inputs (keys and indexes)."""
        return in_inputs(path)


AS_JOB_FIELDS = FieldNames()
# An embed model's job parameter: false fails a job whose text is longer than the model's
# `max_seq_length` (`ContextLengthExceeded`, as OpenAI's and vLLM's servers refuse it) rather
# than embed its first tokens. A worker of a version that reads no parameters truncates.
TRUNCATE = "truncate"
EMBED_PARAMETERS = frozenset({TRUNCATE})
StopString = Annotated[str, Field(min_length=1)]


class SamplingParameters(BaseModel):
    """A generate job's sampling parameters, within the bounds vLLM takes: a job whose values
    it would refuse is refused at submit (422, nothing enqueued), not failed by the worker after
    its wait in the queue. They are OpenAI's and the extra ones vLLM's own server takes; the
    `vllm` backend maps each onto its SamplingParams. Other keys are not refused for a custom
    engine's model (the job keeps them), and are for a `vllm` one (`unknown`): it drops them."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    # strict: no `true`, "5" or 5.0 for a number (a float takes an integer, as in JSON)
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    # no empty stop string, alone as in a list: vLLM's SamplingParams refuses [""], which is
    # what a "" becomes, so such a job failed at the worker after its wait in the queue; its
    # refusals name `stop.0`, not the union's branches (`stop.list[constrained-str].0`)
    stop: (
        Annotated[
            Annotated[StopString, Tag("text")]
            | Annotated[list[StopString], Field(max_length=4), Tag("list")],
            BY_JSON_TYPE,
            AS_SENT,
        ]
        | None
    ) = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64, strict=True)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, strict=True)
    # vLLM's own beyond OpenAI's: 0 or -1 is every token (vLLM's disabled), as is one past the
    # vocabulary
    top_k: int | None = Field(default=None, ge=-1, strict=True)
    min_p: float | None = Field(default=None, ge=0, le=1, strict=True)
    repetition_penalty: float | None = Field(default=None, gt=0, strict=True)
    # at most the job's max_tokens: checked where that is known (its default is the model's)
    min_tokens: int | None = Field(default=None, ge=0, strict=True)
    ignore_eos: StrictBool | None = None

    @classmethod
    def unknown(cls, parameters: Mapping[str, Any]) -> list[str]:
        """The keys of `parameters` that are no sampling parameter, sorted."""
        return sorted(parameters.keys() - cls.model_fields.keys())


def check_parameters(
    config: ModelConfig,
    variant: str,
    parameters: dict[str, Any],
    names: FieldNames = AS_JOB_FIELDS,
) -> None:
    """A generate model's sampling parameters within vLLM's bounds (`SamplingParameters`),
    `max_tokens` within the variant's `max_tokens_limit` (its own, else the model's) and
    `min_tokens` within the job's max_tokens: refused (`ParametersRefused`) rather than failed by
    the worker, or silently cut by the engine. A `vllm` variant refuses other keys: it would drop
    them. A batch model's job takes none but an embed model's `truncate`
    (`_check_batch_parameters`). A refusal names the parameter as `names` says the client sent
    it."""
    if config.kind != "generate":
        _check_batch_parameters(config, parameters, names)
        return
    try:
        sampling = SamplingParameters.model_validate(parameters)
    except ValidationError as exc:
        problems = (f"{names.where(_dotted(e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ParametersRefused("; ".join(problems)) from None
    served = f"model {config.name}:{variant}"
    backend = config.backend_of(variant)
    if backend in GENERATE_BACKENDS and (unknown := SamplingParameters.unknown(parameters)):
        named = ", ".join(names.where(client_named(name)) for name in unknown)
        taken = ", ".join(sorted(SamplingParameters.model_fields))
        raise ParametersRefused(
            f"{named}: not taken by {served} (backend {backend}, which takes: {taken})"
        )
    own = config.variant_parameters(variant)
    limit = own.get("max_tokens_limit")
    if sampling.max_tokens is not None and limit is not None and sampling.max_tokens > int(limit):
        _refuse(names, "max_tokens", f"at most {limit} for {served}")
    max_tokens = names.parameter("max_tokens")
    if (why := _min_tokens_refusal(sampling, unnamed_max_tokens(own), max_tokens)) is not None:
        _refuse(names, "min_tokens", f"{why} for {served}")


def _check_batch_parameters(
    config: ModelConfig, parameters: dict[str, Any], names: FieldNames
) -> None:
    """A batch model's job takes no parameters, but for an embed model's `truncate`
    (`EMBED_PARAMETERS`): parameters such as a `normalize: false` were stored and silently
    ignored."""
    taken = EMBED_PARAMETERS if config.task == "embed" else frozenset()
    if unknown := sorted(parameters.keys() - taken):
        named = ", ".join(names.where(client_named(name)) for name in unknown)
        but = f" but {', '.join(sorted(taken))}" if taken else ""
        raise ParametersRefused(
            f"{named}: model {config.name} takes no job parameters{but} (kind {config.kind}: "
            "its engine runs a job on its inputs alone; engine settings are its config.yaml's)"
        )
    if TRUNCATE in parameters and type(parameters[TRUNCATE]) is not bool:
        _refuse(names, TRUNCATE, "must be a boolean")


def _dotted(location: tuple[int | str, ...]) -> str:
    return ".".join(map(str, location))


def _refuse(names: FieldNames, parameter: str, why: str) -> NoReturn:
    """A refusal naming `parameter` as the client sent it (OpenAI's 400 carries it as
    `param`)."""
    where = names.where(parameter)
    raise ParametersRefused(f"{where}: {why}", param=where)


def _min_tokens_refusal(sampling: SamplingParameters, unnamed: int, max_tokens: str) -> str | None:
    """Why `min_tokens` exceeds the max_tokens the engine will run the job with (the job's own,
    named `max_tokens` as the client sent it, else `unnamed`, what a job naming none runs with),
    as vLLM refuses it; None if it does not. A variant with a limit but no default runs such a
    job with UNNAMED_MAX_TOKENS, not its limit: checked against the limit, a larger min_tokens
    was taken, and the engine cut it silently."""
    if sampling.min_tokens is None:
        return None
    if sampling.max_tokens is not None:
        cap, what = sampling.max_tokens, max_tokens
    else:
        cap, what = unnamed, "the max_tokens a job naming none runs with"
    return f"at most {what} ({cap})" if sampling.min_tokens > cap else None
