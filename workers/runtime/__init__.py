"""Celery bootsteps that host the partition loops in a worker process, and their metrics."""
