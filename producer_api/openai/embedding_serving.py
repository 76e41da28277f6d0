"""OpenAI-compatible embeddings without HTTP: a request is one job of a `task: embed` model (same
validation, routing, quotas and queue as `/v1/jobs`), answered in OpenAI's shape once it ends,
so a request that meets a busy pool waits its turn instead of failing."""

from __future__ import annotations

import re
from typing import Any

import orjson

from producer_api.errors import ConveyorError
from producer_api.jobs.protocol import PredictRequest
from producer_api.openai.protocol import EmbeddingRequest
from producer_api.openai.serving import OpenAIService, awaiting, job_failure, running_on
from shared.codec import as_objects, as_written, dumps
from shared.job_parameters import TRUNCATE, FieldNames
from shared.job_states import JobStatus

# The request's field that holds its texts, which a refusal of a text's length names.
EMBEDDING_INPUT = "input"


class EmbeddingService(OpenAIService):
    async def submit_texts(self, request: EmbeddingRequest) -> str:
        """Enqueue the texts as a job of an embedding model; returns its id."""
        return await self.submit_as_sent(request, self.embedding_job(request))

    def embedding_line(self, body: dict[str, Any]) -> tuple[str, PredictRequest, FieldNames]:
        """A batch line's body (`url: /v1/embeddings`) as the job it is, with its model and
        how a refusal names its fields (as the line's body has them)."""
        request = EmbeddingRequest.model_validate(body)
        return request.model, self.embedding_job(request), request.field_names()

    def embedding_job(self, request: EmbeddingRequest) -> PredictRequest:
        """The job an embeddings request is (a batch line's too). `dimensions` is refused: no
        example model's vectors may be cut short (vLLM refuses it the same way for a model
        not trained for it). A text longer than the model reads fails the job (`truncate`
        false), answered 400 as OpenAI's and vLLM's servers refuse it, where `/v1/jobs`
        embeds its first tokens."""
        usable = self.check_serves(request.model, lambda c: c.task == "embed", "embed text")
        if request.dimensions is not None and usable is not None:
            message = f"dimensions: model {request.model!r} gives whole vectors only"
            raise ConveyorError(400, "invalid_request", message, param="dimensions")
        return PredictRequest(
            inputs=request.inputs(),
            parameters={TRUNCATE: False},
            routing_key=request.user,
            variant=request.variant,
        )

    async def embedded(self, job_id: str, model: str) -> dict[str, Any]:
        """OpenAI's answer once the job ends, waited for in long polls of `max_wait_s`; raises
        as `/predict` answers a job that did not succeed (a text past the model's context as
        vLLM's server refuses it, `job_failure`), and as a non-streamed completion
        does once the producer is asked to stop (each poll then returned at once: the request
        spun, reading the job, until the server cut it) or Redis stops answering."""
        wait = self.state.settings.max_wait_s
        with awaiting(job_id):
            view = await self.jobs.get(job_id, wait)
            while not JobStatus(view["status"]).terminal:
                if self.state.draining.asked():
                    raise running_on(job_id)
                view = await self.jobs.get(job_id, wait)
        if view["status"] != JobStatus.SUCCEEDED:
            raise job_failure(f"job {job_id}", view["status"], view.get("error"), EMBEDDING_INPUT)
        return embedding_list(model, view.get("outputs"))


def embedding_list(model: str, outputs: Any) -> dict[str, Any]:
    """OpenAI's answer (an `EmbeddingList`), built as a dict: a pydantic model would check
    every number of every vector again. Vectors of numbers still as the worker wrote them go
    out as written. A model of task embed that answers otherwise is a 502 (its job succeeded
    all the same)."""
    embeddings, usage = _written_vectors(outputs) or _parsed_vectors(model, as_objects(outputs))
    data = [
        {"object": "embedding", "index": index, "embedding": vector}
        for index, vector in enumerate(embeddings)
    ]
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _parsed_vectors(model: str, outputs: Any) -> tuple[list[Any], Any]:
    embedder = isinstance(outputs, dict) and "usage" in outputs
    if not embedder or not isinstance(outputs.get("embeddings"), list):
        message = (
            f"model {model!r} answered no list of `embeddings` and `usage`, as task embed must"
        )
        raise ConveyorError(502, "bad_model_output", message)
    return outputs["embeddings"], outputs["usage"]


# An embedder's outputs as the worker writes them (orjson, compact): arrays of numbers, then usage.
_WRITTEN = re.compile(rb'\{"embeddings":\[\[(.*)\]\],"usage":(\{[^{}]*\})\}', re.S)


def _written_vectors(outputs: Any) -> tuple[list[orjson.Fragment], orjson.Fragment] | None:
    """Each vector's text and the usage's, cut out of outputs still as the worker wrote them:
    parsing 32 vectors of 384 numbers and writing them again took half a ms of the producer's
    CPU. None for outputs in any other shape (base64 vectors, other spacing), which are parsed."""
    if not isinstance(outputs, orjson.Fragment):
        return None
    written = _WRITTEN.fullmatch(dumps(outputs))
    if written is None:
        return None
    vectors, usage = written.groups()
    cut = _between_brackets(vectors)
    return None if cut is None else ([as_written(b"[" + v + b"]") for v in cut], as_written(usage))


def _between_brackets(vectors: bytes) -> list[bytes] | None:
    """The texts of `a],[b],[c`, or None unless each is bare numbers (no bracket, brace or
    quote): single bytes are found with memchr, where splitting at `],[` took 90 µs."""
    if b"{" in vectors or b'"' in vectors:
        return None
    cut, start = [], 0
    while (end := vectors.find(b"]", start)) >= 0:
        if not vectors.startswith(b",[", end + 1):
            return None
        cut.append(vectors[start:end])
        start = end + 3
    cut.append(vectors[start:])
    return None if any(b"[" in vector for vector in cut) else cut
