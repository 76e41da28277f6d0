"""`parameters.torch` that is no mapping is named once: the refusal read `parameters.torch:
torch: Input should be a valid dictionary`, the option named twice as if one were nested."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_repository import ModelConfigError, ModelRepository


def test_torch_options_that_are_no_mapping_are_named_once(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.yaml").write_text("kind: batch\nbackend: torch\nparameters: {torch: [1]}\n")
    with pytest.raises(ModelConfigError) as refused:
        ModelRepository.load(tmp_path)
    assert str(refused.value).endswith(
        "model m variant default: parameters.torch: Input should be a valid dictionary or "
        "instance of TorchOptions, not [1]"
    )
