"""A generate job's failure that the producer answers apart: the worker's engine raises it, its
class name is the job's error `type`, and OpenAI's routes read that."""

from __future__ import annotations


class ContextLengthExceeded(ValueError):
    """A prompt that leaves no room for one token in the model's context. Its message starts as
    vLLM's server's refusal does, which OpenAI's clients match ("maximum context length"): OpenAI's
    routes answer it with 400 as vLLM's does, not as the model failing on the request (422)."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens  # the job's usage counts them: it read its prompt
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {prompt_tokens} input tokens, which leaves no room for any output "
            "tokens. Please reduce the length of the input prompt."
        )
