"""The Batch API resource (`/v1/batches`; not the workers' micro-batches): JSONL files of job
requests run on the bulk lane (like OpenAI's Batch API), with progress, cancellation, expiry,
results and errors as JSONL, and a webhook."""
