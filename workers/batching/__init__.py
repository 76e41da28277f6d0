"""Dynamic micro-batching of `batch` models: gather entries, run one engine call, write back."""
