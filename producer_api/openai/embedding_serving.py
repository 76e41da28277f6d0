"""OpenAI-compatible embeddings without HTTP: a request is one job of a `task: embed` model (same
validation, routing, quotas and queue as `/v1/jobs`), answered in OpenAI's shape once it ends,
so a request that meets a busy pool waits its turn instead of failing."""

from __future__ import annotations

from typing import Any

from producer_api.errors import ConveyorError
from producer_api.jobs.protocol import PredictRequest
from producer_api.jobs.serving import unsuccessful
from producer_api.openai.protocol import EmbeddingRequest
from producer_api.openai.serving import OpenAIService
from shared.codec import as_objects
from shared.job_states import JobStatus


class EmbeddingService(OpenAIService):
    async def submit_texts(self, request: EmbeddingRequest) -> str:
        """Enqueue the texts as a job of an embedding model; returns its id. `dimensions` is
        refused: no example model's vectors may be cut short (vLLM refuses it the same way
        for a model not trained for it)."""
        self.check_serves(request.model, lambda config: config.task == "embed", "embed text")
        if request.dimensions is not None:
            message = f"dimensions: model {request.model!r} gives whole vectors only"
            raise ConveyorError(400, "invalid_request", message)
        body = PredictRequest(
            inputs=request.inputs(), routing_key=request.user, variant=request.variant
        )
        return (await self.jobs.submit(request.model, body)).job_id

    async def embedded(self, job_id: str, model: str) -> dict[str, Any]:
        """OpenAI's answer once the job ends, waited for in long polls of `max_wait_s`; raises
        as `/predict` answers a job that did not succeed."""
        wait = self.state.settings.max_wait_s
        view = await self.jobs.get(job_id, wait)
        while not JobStatus(view["status"]).terminal:
            view = await self.jobs.get(job_id, wait)
        if view["status"] != JobStatus.SUCCEEDED:
            raise unsuccessful(f"job {job_id}", view["status"], view.get("error"))
        return embedding_list(model, as_objects(view.get("outputs")))


def embedding_list(model: str, outputs: Any) -> dict[str, Any]:
    """OpenAI's answer (an `EmbeddingList`), built as a dict: a pydantic model would check
    every number of every vector again. A model of task embed that answers otherwise is a 502
    (its job succeeded all the same)."""
    if not isinstance(outputs, dict) or not {"embeddings", "usage"} <= outputs.keys():
        message = f"model {model!r} answered no `embeddings` and `usage`, as task embed must"
        raise ConveyorError(502, "bad_model_output", message)
    data = [
        {"object": "embedding", "index": index, "embedding": vector}
        for index, vector in enumerate(outputs["embeddings"])
    ]
    return {"object": "list", "data": data, "model": model, "usage": outputs["usage"]}
