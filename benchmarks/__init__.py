"""Reproducible benchmarks: ratios measured in one run (see benchmarks/README.md)."""
