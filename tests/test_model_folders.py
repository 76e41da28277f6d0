"""Which folders of a model repository are models: every one, except those named `.…` or `_…`
(no model's name starts so) and those without a config.yaml no model could be named. A folder
without a config.yaml (`config.yml`, `Config.yaml`) was skipped silently and its model never
served; a hidden folder holding a copy of a config.yaml (`.ipynb_checkpoints`) stopped the
whole repository on its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository

CONFIG = "kind: batch\nbackend: identity\n"


def _model(root: Path, folder: str, file: str = "config.yaml", text: str = CONFIG) -> Path:
    (root / folder).mkdir(parents=True)
    (root / folder / file).write_text(text)
    return root / folder


@pytest.mark.parametrize("file", ["config.yml", "Config.yaml", "config.yaml.bak"])
def test_a_folder_without_config_yaml_is_refused_by_name(tmp_path: Path, file: str) -> None:
    _model(tmp_path, "good")
    folder = _model(tmp_path, "typo", file)
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value) == (
        f"{folder}: no config.yaml; each folder of a model repository is a model's"
    )


def test_hidden_and_underscored_folders_and_files_are_no_models(tmp_path: Path) -> None:
    """Nor a folder no model could be named without a config.yaml: a volume's `lost+found`."""
    _model(tmp_path, "m")
    (tmp_path / "lost+found").mkdir()
    _model(tmp_path, ".ipynb_checkpoints")  # a notebook's copy of m's config.yaml
    _model(tmp_path, "__pycache__", "engine.cpython-311.pyc", "")
    (tmp_path / "README.md").write_text("models\n")
    assert [config.name for config in ModelRepository.load(tmp_path)] == ["m"]


def test_a_linked_folder_is_a_model_by_its_own_name(tmp_path: Path) -> None:
    """As Triton: a link is another model of the same config; a `name:` of the folder it
    links to is refused, naming both."""
    _model(tmp_path, "m")
    (tmp_path / "alias").symlink_to(tmp_path / "m")
    assert [config.name for config in ModelRepository.load(tmp_path)] == ["alias", "m"]
    (tmp_path / "m" / "config.yaml").write_text(f"name: m\n{CONFIG}")
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'alias' / 'config.yaml'}: name 'm' must match its folder's"
    )


def test_a_broken_link_for_config_yaml_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'm' / 'config.yaml'}: cannot read: No such file or directory"
    )
