"""What an OpenAI chat request asks of the model reaches it as vLLM's server would pass it on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producer_api.openai.protocol import ChatCompletionRequest


def test_text_parts_of_a_message_are_joined_by_newlines_as_vllm_joins_them() -> None:
    """OpenAI's SDKs send a message's `content` as parts; joined bare, "What is" and "the
    capital?" reached the model as "What isthe capital?" (vLLM's server joins them by "\\n")."""
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the capital?"}]
    body = {"model": "smollm2", "messages": [{"role": "user", "content": parts}]}
    inputs = ChatCompletionRequest.model_validate(body).inputs()
    assert inputs == {"messages": [{"role": "user", "content": "What is\nthe capital?"}]}


def test_vllms_usage_in_every_chunk_is_refused() -> None:
    """`stream_options.continuous_usage_stats` was ignored: every chunk carried `usage: null`
    where the client read running counts."""
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "smollm2", "messages": messages, "stream": True}
    ChatCompletionRequest.model_validate(
        {**body, "stream_options": {"continuous_usage_stats": False}}
    )
    with pytest.raises(ValidationError) as refused:
        options = {"include_usage": True, "continuous_usage_stats": True}
        ChatCompletionRequest.model_validate({**body, "stream_options": options})
    assert refused.value.errors()[0]["loc"] == ("stream_options", "continuous_usage_stats")
