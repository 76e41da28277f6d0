"""A real generate engine for stream tests (the custom backend `tests.paced_engine:PacedEngine`):
it writes the prompt's words back, one per step, a step every `step_ms`, so a stream lasts as
long as a test needs without a language model's start-up or CPU cost. A word of ODD_TEXTS is
yielded as its value, what a faulty engine might yield as text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from workers.engines.base import GenerateEngine, GenerateRequest, TokenChunk

ODD_TEXTS: dict[str, Any] = {"<bytes>": b"\xff", "<none>": None}


class PacedEngine(GenerateEngine):
    async def load(self) -> None:
        await asyncio.sleep(float(self.parameters.get("load_ms", 0)) / 1000)  # a slow start
        self.step_s = float(self.parameters.get("step_ms", 50)) / 1000
        self._aborted: set[str] = set()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        prompt = request.prompt or " ".join(m["content"] for m in request.messages or [])
        words = prompt.split() or ["word"]
        for step in range(request.max_tokens):
            await asyncio.sleep(self.step_s)
            if request.request_id in self._aborted:
                return
            last = step == request.max_tokens - 1
            word = words[step % len(words)]
            yield TokenChunk(
                text=ODD_TEXTS.get(word, f"{word} "),
                finish_reason="length" if last else None,
                prompt_tokens=len(words),
                completion_tokens=step + 1,
            )

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        if self.parameters.get("abort_fails"):  # as an engine may for a request it let go
            raise KeyError(request_id)
