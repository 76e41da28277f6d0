"""The experiments resource: how each variant of a model is doing, against its baseline."""
