"""A custom engine (`package.module:Class`) the worker cannot build is one clear error naming the
model, the variant, the backend and the cause, whatever went wrong: its module raising while it
imports (not only ImportError), its class not an engine, abstract, or its constructor raising.
Those escaped as the bare exception of the engine's code, which named no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfig
from workers.engines.registry import EngineNotFound, create_engine

ENGINES = {
    # a module that fails while it imports, other than for a missing package
    "r8_syntax": "def broken(:\n",
    "r8_raising": "raise RuntimeError('no licence server')\n",
    # classes that import but cannot be built
    "r8_classes": (
        "from workers.engines.base import BatchEngine\n"
        "class NotAnEngine:\n    pass\n"
        "class Abstract(BatchEngine):\n    pass\n"
        "class Raising(BatchEngine):\n"
        "    def __init__(self, config, variant, artifact_dir):\n"
        "        raise OSError('GPU 3 is not visible')\n"
        "    def load(self):\n        pass\n"
        "    def infer(self, inputs):\n        return inputs\n"
    ),
}


@pytest.fixture
def engines_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, source in ENGINES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("backend", "cause"),
    [
        ("r8_syntax:Engine", "cannot import r8_syntax:Engine: invalid syntax"),
        ("r8_raising:Engine", "cannot import r8_raising:Engine: no licence server"),
        ("r8_classes:NotAnEngine", "r8_classes:NotAnEngine is not a BatchEngine or GenerateEngine"),
        ("r8_classes:Abstract", "Abstract could not be built: TypeError: Can't instantiate"),
        ("r8_classes:Raising", "Raising could not be built: OSError: GPU 3 is not visible"),
    ],
)
@pytest.mark.usefixtures("engines_on_path")
def test_a_custom_engine_that_cannot_be_built_names_its_model_and_cause(
    backend: str, cause: str
) -> None:
    config = ModelConfig(name="rerank", kind="batch", backend=backend)
    with pytest.raises(EngineNotFound) as refused:
        create_engine(config, "default", Path("var/models"))
    prefix = f"model rerank variant default: backend {backend!r}: "
    assert str(refused.value).startswith(prefix), refused.value
    assert cause in str(refused.value), refused.value
    assert "\n" not in str(refused.value)  # one line in the worker's log
