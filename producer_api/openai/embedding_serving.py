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

NO_USAGE = {"prompt_tokens": 0, "total_tokens": 0}


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

    async def embedded(self, job_id: str) -> dict[str, Any]:
        """The job's outputs once it ends, waited for in long polls of `max_wait_s`; raises as
        `/predict` answers a job that did not succeed."""
        wait = self.state.settings.max_wait_s
        view = await self.jobs.get(job_id, wait)
        while not JobStatus(view["status"]).terminal:
            view = await self.jobs.get(job_id, wait)
        if view["status"] != JobStatus.SUCCEEDED:
            raise unsuccessful(f"job {job_id}", view["status"], view.get("error"))
        outputs: dict[str, Any] = as_objects(view["outputs"])
        return outputs


def embedding_list(model: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's answer (an `EmbeddingList`), built as a dict: a pydantic model would check
    every number of every vector again."""
    data = [
        {"object": "embedding", "index": index, "embedding": vector}
        for index, vector in enumerate(outputs["embeddings"])
    ]
    usage = outputs.get("usage") or NO_USAGE
    return {"object": "list", "data": data, "model": model, "usage": usage}
