"""An encoder's artifacts with a config.json that is no model config (a Git LFS pointer left by a
clone without LFS, a cut download, a count written as text) are refused at load naming the file:
the worker's start failed with the JSON parser's bare message, or a TypeError, naming nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.minilm_reference import prepared_artifacts
from workers.engines.text_encoding import MODEL_CONFIG_FILE, TOKENIZER_FILE, TextEncoder

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 612\n"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (LFS_POINTER, "is not a JSON object"),
        (b'{"max_position_embeddings": 5', "is not a JSON object"),
        (b"[512]", "is not a JSON object"),
        (
            b'{"max_position_embeddings": "512"}',
            "has max_position_embeddings '512', not an integer",
        ),
    ],
)
def test_a_model_config_that_is_no_config_is_named(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    shutil.copy(prepared_artifacts() / TOKENIZER_FILE, tmp_path / TOKENIZER_FILE)
    (tmp_path / MODEL_CONFIG_FILE).write_bytes(content)
    with pytest.raises(ValueError) as refused:
        TextEncoder.from_artifacts(tmp_path, 256)
    assert str(refused.value).startswith(f"{tmp_path / MODEL_CONFIG_FILE} "), refused.value
    assert problem in str(refused.value), refused.value


def test_a_model_config_without_positions_still_loads(tmp_path: Path) -> None:
    shutil.copy(prepared_artifacts() / TOKENIZER_FILE, tmp_path / TOKENIZER_FILE)
    (tmp_path / MODEL_CONFIG_FILE).write_bytes(b'{"hidden_size": 384}')
    assert TextEncoder.from_artifacts(tmp_path, 256).max_seq_length == 256
