"""A real generate engine for stream tests (the custom backend `tests.paced_engine:PacedEngine`):
it writes the prompt's words back, one per step, a step every `step_ms`, so a stream lasts as
long as a test needs without a language model's start-up or CPU cost. A word of ODD_TEXTS is
yielded as its value, what a faulty engine might yield as text. With parameter `death_flag` (a
file's path), a prompt with the word <die> kills the engine while that file exists (it is
removed): every generation fails from then on, as vLLM's do once its engine-core process died."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from workers.engines.base import GenerateEngine, GenerateRequest, TokenChunk

ODD_TEXTS: dict[str, Any] = {"<bytes>": b"\xff", "<none>": None}


class PacedEngine(GenerateEngine):
    async def load(self) -> None:
        await asyncio.sleep(float(self.parameters.get("load_ms", 0)) / 1000)  # a slow start
        self.step_s = float(self.parameters.get("step_ms", 50)) / 1000
        self._aborted: set[str] = set()
        self._dead = False

    def dead(self) -> bool:
        return self._dead

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk]:
        prompt = request.prompt or " ".join(m["content"] for m in request.messages or [])
        words = prompt.split() or ["word"]
        for step in range(request.max_tokens):
            await asyncio.sleep(self.step_s)
            if "<die>" in words and self._dies():
                self._dead = True
            if self._dead:
                raise RuntimeError("the engine core died")
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

    def _dies(self) -> bool:
        flag = Path(self.parameters.get("death_flag", "/nonexistent"))
        if not flag.exists():
            return False
        flag.unlink()
        return True

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        if self.parameters.get("abort_fails"):  # as an engine may for a request it let go
            raise KeyError(request_id)
