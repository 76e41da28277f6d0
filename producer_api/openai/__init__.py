"""The OpenAI-compatible resource: `POST /v1/chat/completions` and `POST /v1/completions`, each
one Conveyor job whose token stream is rendered in OpenAI's shapes."""
