"""A RoBERTa-like model's position ids start after its padding index (XLM-R's 514 positions hold
512 tokens): a max_seq_length past what a text can fill is refused at load, as a BERT's past its
512 is, rather than failing every longer text's job with an index out of range."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from tests.minilm_reference import prepared_artifacts
from workers.engines.text_encoding import MODEL_CONFIG_FILE, TOKENIZER_FILE, TextEncoder


def artifacts(folder: Path, **config: object) -> Path:
    shutil.copy(prepared_artifacts() / TOKENIZER_FILE, folder / TOKENIZER_FILE)
    (folder / MODEL_CONFIG_FILE).write_bytes(orjson.dumps(config))
    return folder


@pytest.mark.parametrize(("model_type", "pad_token_id"), [("xlm-roberta", 1), ("mpnet", None)])
def test_positions_before_the_first_token_are_not_a_texts(
    tmp_path: Path, model_type: str, pad_token_id: int | None
) -> None:
    folder = artifacts(
        tmp_path, model_type=model_type, max_position_embeddings=514, pad_token_id=pad_token_id
    )
    refused = r"max_seq_length 513 exceeds the model's 512 positions \(.* less the 2 before"
    with pytest.raises(ValueError, match=refused):
        TextEncoder.from_artifacts(folder, 513)
    assert TextEncoder.from_artifacts(folder, 512).max_seq_length == 512


def test_a_bert_fills_all_its_positions(tmp_path: Path) -> None:
    folder = artifacts(tmp_path, model_type="bert", max_position_embeddings=512, pad_token_id=0)
    assert TextEncoder.from_artifacts(folder, 512).max_seq_length == 512
