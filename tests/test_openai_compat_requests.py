"""What an OpenAI chat request asks of the model reaches it as vLLM's server would pass it on."""

from __future__ import annotations

from producer_api.openai.protocol import ChatCompletionRequest


def test_text_parts_of_a_message_are_joined_by_newlines_as_vllm_joins_them() -> None:
    """OpenAI's SDKs send a message's `content` as parts; joined bare, "What is" and "the
    capital?" reached the model as "What isthe capital?" (vLLM's server joins them by "\\n")."""
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the capital?"}]
    body = {"model": "smollm2", "messages": [{"role": "user", "content": parts}]}
    inputs = ChatCompletionRequest.model_validate(body).inputs()
    assert inputs == {"messages": [{"role": "user", "content": "What is\nthe capital?"}]}
