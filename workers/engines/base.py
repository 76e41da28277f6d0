"""The engine interface the batching loops drive; every backend implements one of these two."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.model_repository import ModelConfig


class MissingArtifacts(FileNotFoundError):
    """A model's files are not where its worker looks for them."""


class FailedJob(dict[str, Any]):
    """An engine's output that fails its own job with `exc` (its error, as a raised one's),
    its micro-batch's other jobs served by the same call: raising instead failed the whole
    call, whose bisection reran every other job in ever smaller calls to find it. A dict only
    to stand in an output's place."""

    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc


class EngineBase(ABC):  # noqa: B024 (the two kinds below declare the abstract methods)
    """What every engine is built from: its model's config, variant and artifact folder."""

    def __init__(self, config: ModelConfig, variant: str, artifact_dir: str) -> None:
        self.config = config
        self.variant = variant
        self.artifact_dir = artifact_dir
        self.parameters = config.variant_parameters(variant)

    def artifacts(self, *names: str) -> Path:
        """The artifact folder, once it holds every file in `names`: else one error that names
        them and how to get them, before a library fails on the first with a bare `No such file
        or directory` (the tokenizer's says no more) or goes looking on a model hub."""
        folder = Path(self.artifact_dir)
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            model = self.config.name
            remedy = (
                f"run `conveyor models prepare {model}`"
                if self.config.prepare
                else "put them there, or point CONVEYOR_ARTIFACT_DIR at their parent"
            )
            raise MissingArtifacts(
                f"model {model}: {', '.join(missing)} missing in {folder}; {remedy}"
            )
        return folder

    def dead(self) -> bool:
        """Whether the engine can run nothing more (a generate engine's process died; a CUDA
        error poisoned a batch engine's device): every call then fails at once, and a job failed
        so would be lost through no fault of its own. Its loop stops, leaving its jobs pending,
        and the worker exits to be restarted."""
        return False


class EngineDied(RuntimeError):
    """The engine can run nothing more: the worker exits (and is restarted), its jobs left
    pending for another worker to rerun."""


class BatchEngine(EngineBase):
    """Dynamic-batching engine: one `infer` call per micro-batch, outputs in input order.

    `inline` engines are cheap enough to run on the event loop; others run in a thread so the
    loop keeps serving Redis while the engine computes.
    """

    inline: bool = False

    @abstractmethod
    def load(self) -> None:
        """Load weights and build sessions; called once before serving."""

    def warmup(self) -> None:
        """Run a representative call so the first real batch does not pay for lazy init."""

    @abstractmethod
    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run one micro-batch; raising fails the batch (the loop bisects to find the culprit),
        a `FailedJob` in a job's place fails that job alone."""

    def close(self) -> None:
        """Release engine resources on warm shutdown."""


class StagedBatchEngine(BatchEngine):
    """A batch engine cut into host and device stages, so the batching loop can tokenise and
    pad micro-batch n+1 (`prepare`) and encode the results of n-1 (`finish`) while the device
    runs n (`run`). `prepare` and `finish` may run on `host_threads` threads at once; `run`
    is called from one thread at a time, in submission order. `infer` chains the three, so the
    loop's one-call fallback (bisecting a failed micro-batch) still works."""

    host_threads: int = 1

    @abstractmethod
    def prepare(self, inputs: list[dict[str, Any]]) -> Any:
        """Host work before the device: validate, tokenise, pad (raises on bad input)."""

    @abstractmethod
    def run(self, prepared: Any) -> Any:
        """Queue the device work of a prepared micro-batch; may return before it completes."""

    @abstractmethod
    def finish(self, running: Any) -> list[dict[str, Any]]:
        """Wait for the device work of `run` and encode one output per input, in order."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.finish(self.run(self.prepare(inputs)))


@dataclass(slots=True)
class GenerateRequest:
    """One generation job as the engine sees it (sampling parameters already validated)."""

    request_id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    # The job's parameters no field above names: a custom engine's own (a `vllm` model's job
    # names none: they are refused at submit).
    custom: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TokenChunk:
    """New text of one engine step for one request; the last chunk carries the finish reason."""

    text: str
    token_count: int = 1
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class GenerateEngine(EngineBase):
    """Continuous-batching engine: many concurrent `generate` streams share the engine."""

    @abstractmethod
    async def load(self) -> None:
        """Start the engine (may spawn engine processes)."""

    async def warmup(self) -> None:
        """Generate a few tokens so the first user request does not pay for lazy init."""

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's new text, one chunk per engine step."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a running request within one engine step and free its slot."""

    async def close(self) -> None:
        """Shut the engine down on warm shutdown."""
