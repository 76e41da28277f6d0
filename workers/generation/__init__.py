"""Continuous batching of `generate` models: admit into free engine slots, stream tokens."""
