"""The batches resource: JSONL files of job requests run on the bulk lane (like OpenAI's Batch
API), with progress, cancellation, expiry, results and errors as JSONL, and a webhook."""
