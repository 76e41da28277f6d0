"""Conveyor workers."""
