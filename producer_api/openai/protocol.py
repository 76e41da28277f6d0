"""OpenAI's request and response bodies for (chat) completions and embeddings, as far as Conveyor
serves them.
Fields OpenAI defines that Conveyor does not honour (a chat's echo, suffix, best_of, logit_bias,
response_format, tool_choice, function_call, logprobs, top_logprobs), and vLLM's own that change
its answer (guided decoding and structured outputs, beam search, token id lists, prompt
logprobs, chat template settings, prompt truncation, special tokens, priority), are refused
unless left at their defaults, where the client would otherwise get another answer than it
asked for (other text, or plain text where its SDK reads JSON, a tool or function call or
logprobs); `tools` (and the deprecated `functions`) alone
leave the choice to the model (`auto`), which answers in text,
so they are accepted and ignored."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from shared.job_parameters import FieldNames, SamplingParameters
from shared.json_unions import AS_SENT, BY_JSON_TYPE
from shared.model_names import NAME
from shared.model_repository import client_named

# The job's sampling parameters: OpenAI's and vLLM's extra ones (top_k, min_p, ...).
SAMPLING = tuple(SamplingParameters.model_fields)


def _json_type(kind: type) -> BeforeValidator:
    """A value of JSON's own type, as OpenAI's API takes it: pydantic's lax mode read `true` as
    1, `0` as false (a Literal cannot be made strict)."""

    def check(value: Any) -> Any:
        if value is not None and type(value) is not kind:
            raise ValueError(f"must be {'a boolean' if kind is bool else 'an integer'}")
        return value

    return BeforeValidator(check)


def _only(*taken: Any, unsaid: tuple[Any, ...] = ()) -> BeforeValidator:
    """A field served at its default only (`taken`, or null), whose refusal says what is taken:
    pydantic's "Input should be None" read as a wrong type, "Input should be False" spelled
    JSON's `false` as Python's. `unsaid`: also taken, equal in effect, left out of the message
    (a suffix of "", which adds nothing). A value of another JSON type is refused (`0` is no
    `false`, `{}` no `[]`)."""
    accepted = (*taken, *unsaid)
    shown = ", ".join(json.dumps(value) for value in taken)

    def check(value: Any) -> Any:
        if value is None or any(type(value) is type(t) and value == t for t in accepted):
            return value
        message = "not supported: send {taken} or omit it"
        raise PydanticCustomError("not_served", message, {"taken": shown})

    return BeforeValidator(check)


# The JSON type is checked first (outermost), so `true` for 1 reads as the wrong type it is.
OnlyOne = Annotated[Literal[1], _only(1), _json_type(int)]


def _one_choice(value: Any) -> Any:
    """vLLM's server answers `n` choices, Conveyor one per request (each a job): the refusal says
    so and what to do instead, where pydantic's "Input should be 1" read as a typo."""
    if type(value) is int and value > 1:
        message = "one choice per request is served, not {n}: send {n} requests (seed each apart)"
        raise PydanticCustomError("n_not_served", message, {"n": value})
    return value


OnlyZero = Annotated[Literal[0], _only(0), _json_type(int)]
OnlyFalse = Annotated[Literal[False], _only(False), _json_type(bool)]
OnlyTrue = Annotated[Literal[True], _only(True), _json_type(bool)]
# A field of vLLM's server that Conveyor does not serve: only null (its default) is taken.
NotServed = Annotated[None, _only(None), Field(description="vLLM's; not served: only null")]
Nothing = Annotated[list[Any], Field(max_length=0), _only([])]  # only an empty list
NoEntries = Annotated[dict[str, Any], Field(max_length=0), _only({})]  # only an empty object
# Only the reply as text (a tool or function call is not made)
TextReply = Annotated[Literal["none", "auto"], _only("none", "auto")]


class VllmRequest(BaseModel):
    """vLLM's own fields that its generate and embeddings routes both take, refused unless left
    at their defaults rather than ignored: the prompt's truncation (`truncate_prompt_tokens`,
    vLLM's keeps its last N tokens unless `truncation_side` says right) is the worker's
    tokenizer's to do, and a job's one setting of it would cut every job of its micro-batch
    (an embedding's text past the context is refused, as vLLM's server refuses it without
    the field; an embed worker's tokenizer would keep the first tokens), a
    `priority` would not reorder a queue whose lanes are Conveyor's, and processor arguments
    are for models Conveyor does not serve."""

    truncate_prompt_tokens: NotServed = None
    priority: OnlyZero | None = Field(default=None, description="vLLM's; not served: only 0")
    mm_processor_kwargs: NotServed = None


# A model's name as OpenAI's clients send it: any name, one no model has being unknown (404, as
# OpenAI's API and vLLM's server answer it, which OpenAI's SDK raises as NotFoundError; a 400
# about a pattern, for `SmolLM2` as vLLM's served names are written, was BadRequestError). Its
# length is bounded: refusals quote it.
ModelName = Annotated[str, Field(max_length=256)]


@dataclass(frozen=True, slots=True)
class SentNames(FieldNames):
    """A job's fields as an OpenAI request's client sent them: top-level and dotted
    (`messages.0.content`, not `inputs['messages'][0]['content']`), by the request's own name
    where it has another (`renamed`: a chat's `max_completion_tokens` for the job's `max_tokens`,
    embeddings' `input` for its `texts`). `unlisted`: inputs the job lists where the client sent
    one value (embeddings' one text), whose index the client never sent."""

    renamed: Mapping[str, str] = field(default_factory=dict)
    unlisted: frozenset[str] = frozenset()

    def parameter(self, name: str) -> str:
        return self.renamed.get(name, name)

    def where(self, name: str) -> str:
        return self.parameter(name)

    def input(self, path: Sequence[str | int]) -> str:
        if not path:
            return "body"
        head, *rest = path
        if head in self.unlisted:
            rest = rest[1:]
        return ".".join([self.parameter(str(head)), *map(str, rest)])


class StreamOptions(BaseModel):
    """vLLM's `continuous_usage_stats` (usage in every chunk) is refused: each chunk would carry
    `usage: null`, where the client reads running counts."""

    include_usage: StrictBool | None = False  # null: OpenAI's default, false
    continuous_usage_stats: OnlyFalse | None = Field(
        default=None, description="vLLM's; not served: only false"
    )


class TextFormat(BaseModel):
    """The one `response_format` answered as asked: plain text (not JSON, nor a schema's)."""

    type: Literal["text"]


class SamplingRequest(SamplingParameters, VllmRequest):
    """What both endpoints share: the model, sampling (a job's bounds, vLLM's extra parameters
    with them: `extra_body` in OpenAI's SDK), streaming, and Conveyor's `variant`. `user`
    doubles as the routing key, so one user stays on one variant. A null is OpenAI's default,
    as its API takes it (its SDK sends `n=None`, `stream=None`). Other fields are ignored, as
    vLLM's server ignores them (OpenAI's own API refuses them)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: ModelName
    n: Annotated[OnlyOne, BeforeValidator(_one_choice)] | None = Field(
        default=1, description="Only one choice per request"
    )
    # Fields that would change the answer and are not honoured: refused unless left at their
    # default, not ignored (the client would get another answer than it asked for).
    logit_bias: NoEntries | None = Field(default=None, description="Not supported: only empty")
    response_format: TextFormat | None = Field(
        default=None, description='Not supported: only {"type": "text"}'
    )
    # a chat's too, as vLLM's server takes it there: ignored, one sampled choice read as the best
    # of several
    best_of: OnlyOne | None = Field(default=None, description="Not supported: only 1")
    # vLLM's own fields that change the answer (structured output, beam search, token lists,
    # logprobs of the prompt): its server acts on them, so they are refused unless left at
    # their default, as OpenAI's unhonoured ones are, not ignored as other unknown fields
    guided_json: NotServed = None
    guided_regex: NotServed = None
    guided_choice: NotServed = None
    guided_grammar: NotServed = None
    structured_outputs: NotServed = None
    prompt_logprobs: NotServed = None
    use_beam_search: OnlyFalse | None = None
    include_stop_str_in_output: OnlyFalse | None = None
    allowed_token_ids: Nothing | None = None
    bad_words: Nothing | None = None
    stop_token_ids: Nothing | None = None
    # vLLM's detokenizing and output fields: its answer's text (special tokens) or its shape
    # (token ids) would differ
    skip_special_tokens: OnlyTrue | None = None
    spaces_between_special_tokens: OnlyTrue | None = None
    return_tokens_as_token_ids: OnlyFalse | None = None
    return_token_ids: OnlyFalse | None = None
    logits_processors: NotServed = None
    vllm_xargs: NotServed = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    variant: str | None = Field(default=None, pattern=NAME, description="Conveyor: a variant")

    @field_validator("stream_options", mode="after")
    @classmethod
    def _only_when_streaming(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        """As OpenAI's API and vLLM's server refuse them: the client expects a usage chunk that
        a response without a stream would not send. Refused as a field, so the refusal names it
        (OpenAI's `param`), where the whole body's refusal named none. A `stream` itself refused
        is not in `info.data`: its own refusal says enough."""
        if value is not None and "stream" in info.data and not info.data["stream"]:
            message = "only allowed when stream is true"
            raise PydanticCustomError("stream_options_without_stream", message)
        return value

    def parameters(self) -> dict[str, Any]:
        """The job's `parameters`: only what the client set."""
        values = {name: getattr(self, name) for name in SAMPLING}
        return {name: value for name, value in values.items() if value is not None}

    def field_names(self) -> SentNames:
        """How a refusal of the job names its fields: as fields of this body."""
        return SentNames()

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        """A part of another type (an image, audio) is refused as one the model cannot read:
        pydantic's "type: Input should be 'text'; text: Field required" read as a malformed
        text part."""
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "text":
            message = "{kind} parts are not taken: the model reads text only"
            raise PydanticCustomError("part_not_served", message, {"kind": client_named(kind)})
        return value


class RefusalPart(BaseModel):
    """An assistant's refusal in a chat's history, as OpenAI's API takes it: read as its text,
    as vLLM's server reads it (refused as a part the model cannot read, a history replayed from
    OpenAI's answers was a 400)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["refusal"]
    refusal: str

    @property
    def text(self) -> str:
        return self.refusal


def _part_kind(value: Any) -> str:
    """A part's model by its `type`: a refusal's, else a text's (which refuses other types)."""
    return "refusal" if isinstance(value, dict) and value.get("type") == "refusal" else "text"


Part = Annotated[
    Annotated[TextPart, Tag("text")] | Annotated[RefusalPart, Tag("refusal")],
    Discriminator(_part_kind),
    AS_SENT,
]


class ChatMessage(BaseModel):
    """`developer` is OpenAI's newer name for `system`; text parts are joined by newlines, as
    vLLM's server joins them (joined bare, "What is" and "the capital?" read "What isthe")."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    # null: an assistant's turn as OpenAI answers a refusal or a tool call (its text elsewhere),
    # which a client replaying its history sends back; read as empty, as vLLM's server does
    content: (
        Annotated[
            # no empty list of parts, as OpenAI's API refuses it (an empty string it takes)
            Annotated[str, Tag("text")] | Annotated[list[Part], Field(min_length=1), Tag("list")],
            BY_JSON_TYPE,
            AS_SENT,
        ]
        | None
    )

    @field_validator("content", mode="after")
    @classmethod
    def _null_for_an_assistant(cls, value: Any, info: ValidationInfo) -> Any:
        """Only an assistant's turn has no content (its refusal or tool call elsewhere), as
        OpenAI's API takes it: another's null was read as an empty message, where OpenAI's
        refuses it. A `role` itself refused is not in `info.data`: its own refusal says enough."""
        if value is None and info.data.get("role", "assistant") != "assistant":
            message = "null is taken for an assistant's turn only: send a string or a list of parts"
            raise PydanticCustomError("content_null", message)
        return value

    def as_input(self) -> dict[str, str]:
        role = "system" if self.role == "developer" else self.role
        content = self.content or ""
        text = content if isinstance(content, str) else "\n".join(p.text for p in content)
        return {"role": role, "content": text}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    # OpenAI's newer name for `max_tokens`: sent with it, it is the one that counts, as in
    # vLLM's server (SDKs moving to it may still send both)
    max_completion_tokens: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="OpenAI's newer max_tokens: sent with max_tokens, this one counts",
    )
    tool_choice: TextReply | None = Field(
        default=None, description="Not supported: only none or auto (the reply is text)"
    )
    # the deprecated `tool_choice` of `functions`, which OpenAI's SDKs still send
    function_call: TextReply | None = Field(
        default=None, description="Not supported: only none or auto (the reply is text)"
    )
    logprobs: OnlyFalse | None = Field(default=None, description="Not supported: only false")
    top_logprobs: OnlyZero | None = Field(default=None, description="Not supported: only 0")
    # vLLM's chat template fields and chat `echo`: the prompt is rendered by the model's own
    # template, with a generation prompt
    chat_template: NotServed = None
    chat_template_kwargs: NoEntries | None = None
    add_generation_prompt: OnlyTrue | None = None
    continue_final_message: OnlyFalse | None = None
    echo: OnlyFalse | None = None
    # vLLM's chat default: the template adds the special tokens
    add_special_tokens: OnlyFalse | None = None
    documents: NotServed = None
    media_io_kwargs: NotServed = None

    def inputs(self) -> dict[str, Any]:
        return {"messages": [message.as_input() for message in self.messages]}

    def parameters(self) -> dict[str, Any]:
        parameters = super().parameters()
        if self.max_completion_tokens is not None:
            parameters["max_tokens"] = self.max_completion_tokens
        return parameters

    def field_names(self) -> SentNames:
        """The job's `max_tokens` is `max_completion_tokens` where the client sent that."""
        if self.max_completion_tokens is None:
            return super().field_names()
        return SentNames({"max_tokens": "max_completion_tokens"})


def _text_only(why: str) -> BeforeValidator:
    """Token arrays (lists holding other than text) refused, saying `why`: the model tokenises
    its text itself, where pydantic's "Input should be a valid string" on each id read as a
    malformed string."""

    def check(value: Any) -> Any:
        if isinstance(value, list) and any(not isinstance(item, str) for item in value):
            raise ValueError(why)
        return value

    return BeforeValidator(check)


def _one_prompt(prompts: list[str]) -> list[str]:
    if len(prompts) > 1:
        raise ValueError(
            "a list of prompts asks for one completion each; this server completes one prompt"
            " per request (send each alone, or all of them as a batch: /v1/batches)"
        )
    return prompts


# A prompt is text, or a list of one text (OpenAI's list is a batch of prompts, each completed
# apart: joining them answered one completion of their concatenation). Never empty: the minimum
# is set on each branch (on the union, the OpenAPI's minLength would bind strings only), and only
# the branch the value's type picks reports an error.
Prompt = Annotated[
    Annotated[str, Field(min_length=1), Tag("text")]
    | Annotated[
        list[str],
        # maxItems told, not enforced by pydantic: `_one_prompt` says why in its refusal
        Field(min_length=1, json_schema_extra={"maxItems": 1}),
        AfterValidator(_one_prompt),
        Tag("list"),
    ],
    BY_JSON_TYPE,
    AS_SENT,
    _text_only("token ids are not taken: the model tokenises its text; send it as a string"),
]


class CompletionRequest(SamplingRequest):
    """`max_tokens` defaults to 16, as in OpenAI's API (null too); one prompt per request.
    `echo` puts the prompt before the completion's text, as vLLM's server does."""

    prompt: Prompt
    max_tokens: int | None = Field(default=16, ge=1, strict=True)
    echo: StrictBool | None = False
    suffix: Annotated[Literal[""] | None, _only(None, unsaid=("",))] = Field(
        default=None, description="Not supported: only null (or empty)"
    )
    # 0 still asks for the chosen tokens' logprobs (OpenAI's and vLLM's answer carries them)
    logprobs: NotServed = Field(default=None, description="Not supported: only null")
    add_special_tokens: OnlyTrue | None = None  # vLLM's completions default
    prompt_embeds: NotServed = None

    @field_validator("max_tokens", mode="after")
    @classmethod
    def _default_for_null(cls, value: int | None) -> int:
        """A null was dropped from the job's parameters: the model's own default (256) ran."""
        return 16 if value is None else value

    def inputs(self) -> dict[str, Any]:
        return {"prompt": self.text()}

    def text(self) -> str:
        """The one prompt's text."""
        prompt = self.prompt
        return prompt if isinstance(prompt, str) else prompt[0]

    def echoed(self) -> str:
        """What the completion's text starts with: the prompt if `echo`, else nothing."""
        return self.text() if self.echo else ""


# The requests a generate model answers, each as one job.
Sampling = ChatCompletionRequest | CompletionRequest


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None

    @field_serializer("delta")
    def _delta(self, delta: ChatDelta) -> dict[str, str]:
        """OpenAI's deltas name only what they carry (`{"content": "..."}`)."""
        return delta.model_dump(exclude_none=True)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class Completion(BaseModel):
    """Both the whole completion and each streamed chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# LangChain's OpenAIEmbeddings sends tiktoken's token ids unless told not to: ids of OpenAI's
# tokenizer, not the model's, so they are refused rather than embedded as nonsense.
TEXT_ONLY = (
    "a string or a list of strings (token arrays are not taken: the model tokenises its text; "
    "LangChain's OpenAIEmbeddings sends text with check_embedding_ctx_length=False)"
)


# A text to embed: never empty, alone or in a list, as OpenAI's API refuses it ("cannot be an
# empty string"); an empty one was embedded as the special tokens alone, a vector of nothing.
EmbedText = Annotated[str, Field(min_length=1)]


class EmbeddingRequest(VllmRequest):
    """OpenAI's embeddings request. `input` is text (one string or a list): the model tokenises
    it itself, so token arrays are refused. `dimensions` (shortened vectors) is refused unless
    the model's vectors could be cut, which minilm's cannot. vLLM's pooling fields are taken
    at the defaults the engine answers with (special tokens added, vectors as the model pools
    them, base64 as little-endian float32), refused otherwise."""

    model_config = ConfigDict(extra="ignore")

    model: ModelName
    input: Annotated[
        Annotated[EmbedText, Tag("text")]
        | Annotated[list[EmbedText], Field(min_length=1), Tag("list")],
        BY_JSON_TYPE,
        AS_SENT,
        _text_only(TEXT_ONLY),
    ]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, strict=True)
    user: str | None = Field(default=None, max_length=256)
    variant: str | None = Field(default=None, pattern=NAME, description="Conveyor: a variant")
    add_special_tokens: OnlyTrue | None = None
    truncation_side: NotServed = None
    padding: NotServed = None
    use_activation: OnlyTrue | None = None
    normalize: OnlyTrue | None = None  # vLLM's older name for use_activation
    embed_dtype: Annotated[Literal["float32"], _only("float32")] | None = None
    endianness: Annotated[Literal["native", "little"], _only("native", "little")] | None = None

    def inputs(self) -> dict[str, Any]:
        """The job's inputs for a model of `task: embed`."""
        texts = [self.input] if isinstance(self.input, str) else self.input
        return {"texts": texts, "encoding_format": self.encoding_format}

    def field_names(self) -> SentNames:
        """The job's `texts` are `input`: a list, or one string (listed by the job)."""
        one = frozenset({"texts"}) if isinstance(self.input, str) else frozenset()
        return SentNames({"texts": "input"}, one)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a string: base64 of the little-endian float32 values


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
