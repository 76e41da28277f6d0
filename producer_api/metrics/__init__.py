"""Prometheus scrape endpoint of the producer."""
