"""Conveyor's user-facing layer: the `conveyor` command line and the Python client."""
