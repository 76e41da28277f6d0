"""OpenAI's expiry policy for a Batch API file, apart from the file store: the CLI checks an
`--expires-after` against it before any call, and importing it from the store cost the CLI
Redis, the job store and the model repository (~0.6 s) to print its help."""

from __future__ import annotations

# An upload's `expires_after`, a batch's `output_expires_after` for its output and error files:
# this many seconds from its `created_at`.
EXPIRES_AFTER_MIN_S, EXPIRES_AFTER_MAX_S = 3600, 2_592_000


def file_expiry(created_at: int, asked_s: int | None, ttl_s: int) -> int:
    """When a file created at `created_at` (s) expires: `asked_s` later (OpenAI's expiry
    policy), the result TTL `ttl_s` at most, since its tenant's index and budget keys, or its
    batch's, last no longer."""
    return created_at + min(asked_s or ttl_s, ttl_s)
