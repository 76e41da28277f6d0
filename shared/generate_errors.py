"""A job's failure that the producer answers apart: the worker's engine raises it, its class
name is the job's error `type`, and OpenAI's routes read that (a generate job's prompt, an
embeddings job's text, past the model's context)."""

from __future__ import annotations


class ContextLengthExceeded(ValueError):
    """An input past the model's context: a prompt that leaves no room for one token, or a text
    to embed longer than the model reads (`embedding`, asked for by OpenAI's embeddings route,
    which refuses what `/v1/jobs` truncates). Its message is vLLM's server's refusal word for
    word, which OpenAI's clients match ("maximum context length"): OpenAI's routes answer it
    with 400 as vLLM's does, not as the model failing on the request (422)."""

    def __init__(self, prompt_tokens: int, max_model_len: int, *, embedding: bool = False) -> None:
        self.prompt_tokens = prompt_tokens  # the job's usage counts them: it read its prompt
        asked = (
            f"you requested {prompt_tokens} tokens in the input for embedding generation. "
            "Please reduce the length of the input."
            if embedding
            else f"your prompt contains {prompt_tokens} input tokens, which leaves no room for "
            "any output tokens. Please reduce the length of the input prompt."
        )
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, {asked}"
        )
