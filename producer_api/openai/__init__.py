"""The OpenAI-compatible resource: `POST /v1/chat/completions`, `POST /v1/completions` and
`POST /v1/embeddings`, each one Conveyor job answered in OpenAI's shapes (a completion's token
stream as its chunks)."""

CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
)
# The routes OpenAI's SDKs call: their refusals answer in OpenAI's shape (producer_api.errors).
OPENAI_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH})
