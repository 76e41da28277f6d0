"""A text its tokenizer makes no token of: minilm's real ONNX model, served with its real
tokenizer.json less the post-processor that adds [CLS] and [SEP] (as a custom model's export may
ship it), so an empty or whitespace-only text tokenises to nothing. Such a text fails its own job
by name, beside other texts or alone, never embedded as a zero vector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.minilm_reference import DIMENSION, minilm_config, prepared_artifacts
from workers.batching.micro_batch_executor import execute
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine
from workers.engines.text_encoding import TOKENIZER_FILE

NO_TOKENS = "has no tokens"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> OnnxRuntimeEngine:
    """The minilm engine on artifacts whose tokenizer adds no special tokens."""
    source = prepared_artifacts()
    folder = tmp_path_factory.mktemp("no_special_tokens")
    for name in ("model.onnx", "config.json"):
        (folder / name).symlink_to(source / name)
    tokenizer = json.loads((source / TOKENIZER_FILE).read_text())
    tokenizer["post_processor"] = None
    (folder / TOKENIZER_FILE).write_text(json.dumps(tokenizer))
    engine = OnnxRuntimeEngine(minilm_config(), "default", str(Path(folder)))
    engine.load()
    return engine


@pytest.mark.parametrize("texts", [[""], ["   \n\t"], ["fine", ""]])
def test_a_text_without_tokens_is_refused_by_name(engine: OnnxRuntimeEngine, texts: list[str]):
    with pytest.raises(ValueError, match=rf"inputs\.texts\[{len(texts) - 1}\] {NO_TOKENS}"):
        engine.infer([{"texts": texts}])


async def test_only_the_job_with_the_tokenless_text_fails_in_its_micro_batch(
    engine: OnnxRuntimeEngine,
):
    jobs = [{"texts": ["a cat"]}, {"texts": ["queues", " "]}, {"texts": ["workers", "go"]}]
    outcomes = await execute(engine, jobs)
    bad = outcomes[1]
    assert bad.output is None and bad.error is not None
    assert bad.error["type"] == "ValueError" and NO_TOKENS in bad.error["message"]
    for job, outcome in zip((jobs[0], jobs[2]), (outcomes[0], outcomes[2]), strict=True):
        assert outcome.error is None and outcome.output is not None
        assert outcome.output["embeddings"].shape == (len(job["texts"]), DIMENSION)
