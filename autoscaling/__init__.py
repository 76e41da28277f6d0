"""Conveyor autoscaling."""
