"""Conveyor shared."""
