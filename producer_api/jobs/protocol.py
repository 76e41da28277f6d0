"""Request and response bodies of the jobs resource."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, Tag

from producer_api.json_unions import AS_SENT, BY_JSON_TYPE
from shared.model_repository import NAME, in_inputs


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


class PredictRequest(BaseModel):
    """A job body without the model (the path names it). Unknown fields are refused, since a
    typo such as `input` would otherwise be silently ignored. Infinite or NaN times are
    refused (422) rather than reaching the deadline arithmetic, as are times that are no JSON
    number (`true` was a one-second `ttl_s`, `"5"` read as 5)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    variant: str | None = Field(default=None, pattern=NAME)
    inputs: dict[str, Any]
    parameters: dict[str, Any] = Field(default_factory=dict)
    routing_key: str | None = Field(default=None, max_length=256)
    deadline: float | None = Field(
        default=None,
        gt=0,
        le=1e11,
        strict=True,
        description="Unix time after which not to run; one already past is refused (422)",
    )
    # a millisecond at least: deadlines are whole Unix ms, so a shorter one was already past
    # when enqueued (accepted only to expire), as a past `deadline` is refused
    ttl_s: float | None = Field(
        default=None, ge=0.001, le=1e9, strict=True, description="Seconds from now to deadline"
    )
    priority: Literal["online", "bulk"] = "online"
    webhook: str | None = Field(
        default=None,
        max_length=2048,
        description="POSTed a signed event when the job ends; must match the allow-list",
    )


class JobRequest(PredictRequest):
    model: str = Field(pattern=NAME)


class JobUrls(BaseModel):
    self: str
    events: str


class JobAccepted(BaseModel):
    id: str
    status: str
    model: str
    variant: str
    urls: JobUrls
    queue_position: int | None = Field(
        default=None, description="Entries ahead of the job in its lane when this was answered"
    )
    eta_ms: int | None = Field(
        default=None, description="Estimated ms until it starts; null while no rate is known"
    )


class JobError(BaseModel):
    """Why a job did not succeed: an exception's name, `DeadlineExceeded`, `DeadLettered`..."""

    type: str
    message: str


class Attempt(BaseModel):
    """One delivery of a job to a worker and how it ended; `crashed`: the worker stopped
    answering and another took the job over."""

    consumer: str | None = Field(default=None, description="The worker's consumer name")
    host: str | None = None
    pid: int | None = None
    started: float | None = Field(default=None, description="Unix time it was handed over")
    ended: float | None = Field(default=None, description="Unix time it ended")
    outcome: Literal["succeeded", "failed", "crashed", "expired", "cancelled", "dead-lettered"]
    error: JobError | None = None


class JobView(BaseModel):
    id: str
    status: str
    model: str | None = None
    variant: str | None = None
    outputs: Any = None
    error: JobError | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    batch_size: int | None = None
    attempts: int | None = None
    replay_of: str | None = Field(
        default=None, description="A dead letter's replay: the id of the job it runs again"
    )
    prompt_tokens: int | None = Field(
        default=None, description="A generate job's, once it ended: tokens of its prompt"
    )
    completion_tokens: int | None = Field(
        default=None, description="A generate job's, once it ended: tokens it generated"
    )
    queue_position: int | None = Field(
        default=None, description="Only while queued: entries ahead of it in its lane"
    )
    eta_ms: int | None = Field(
        default=None, description="Only while queued: estimated ms until it starts (or null)"
    )
    attempt_history: list[Attempt] | None = Field(
        default=None, description="Every attempt, oldest first; only with `?attempts=true`"
    )
