"""Tokenisation and pooling for sentence-encoder engines, shared so that every backend (ONNX
Runtime, TensorRT) turns the same texts into the same vectors as sentence-transformers does."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_SEQ_LENGTH = 256
# Upper bound on texts per engine call: a micro-batch of 32 jobs may carry 256 texts each, and one
# padded call over all of them could need gigabytes of activations.
DEFAULT_MAX_TEXTS_PER_CALL = 256


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Encoder inputs of one engine call, padded to the longest text of that call."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        rows, columns = self.input_ids.shape
        return int(rows), int(columns)

    def feeds(self) -> dict[str, np.ndarray]:
        """Inputs by the tensor names the exported graph uses."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


class TextEncoder:
    """The fast (Rust) tokenizer of the model, truncating like sentence-transformers'
    `max_seq_length` (special tokens included) and padding per call rather than to a fixed size."""

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int) -> None:
        self.max_seq_length = max_seq_length
        self._tokenizer = tokenizer
        tokenizer.enable_truncation(max_length=max_seq_length)
        # tokenizer.json pads every text to a fixed 128; padding happens per call in `tokenize`.
        tokenizer.no_padding()

    @classmethod
    def from_artifacts(cls, artifact_dir: Path, max_seq_length: int) -> TextEncoder:
        return cls(Tokenizer.from_file(str(artifact_dir / TOKENIZER_FILE)), max_seq_length)

    def tokenize(
        self, texts: Sequence[str], pad_to: int | None = None, widths: Sequence[int] = ()
    ) -> TokenBatch:
        """Tokenise `texts`, padded to the longest of them, or to the first of the ascending
        `widths` that holds it (a CUDA graph's shape bucket), or padded or cut to exactly
        `pad_to` tokens (for a fixed shape, like INT8 calibration's)."""
        encodings = self._tokenizer.encode_batch(list(texts))
        longest = max(len(e.ids) for e in encodings)
        width = pad_to or next((w for w in widths if w >= longest), longest)
        return TokenBatch(
            input_ids=_matrix([e.ids for e in encodings], width),
            attention_mask=_matrix([e.attention_mask for e in encodings], width),
            token_type_ids=_matrix([e.type_ids for e in encodings], width),
        )


def _matrix(rows: list[list[int]], width: int) -> np.ndarray:
    """Rows as one int64 matrix (the exported graph's input type), zero-padded (the pad id and
    a zero attention mask) or cut to `width`."""
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:width]
    return out


def mean_pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over real tokens, then L2 normalisation (same epsilons),
    so a vector does not depend on how much padding its batch needed."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (hidden.astype(np.float32) * mask).sum(axis=1)
    pooled = summed / np.clip(mask.sum(axis=1), 1e-9, None)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    result: np.ndarray = pooled / np.clip(norms, 1e-12, None)
    return result


def flatten_texts(inputs: list[dict[str, Any]]) -> tuple[list[str], list[int]]:
    """All texts of a micro-batch in job order, and how many each job brought, so one engine call
    serves every job and the vectors can be handed back per job."""
    texts: list[str] = []
    counts: list[int] = []
    for item in inputs:
        job_texts = item.get("texts")
        if not isinstance(job_texts, list) or not all(isinstance(t, str) for t in job_texts):
            raise ValueError("inputs.texts must be a list of strings")
        texts.extend(job_texts)
        counts.append(len(job_texts))
    return texts, counts


def chunks(texts: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


def split_per_job(embeddings: np.ndarray, counts: list[int]) -> list[dict[str, Any]]:
    """One output per job in input order, each a float32 array the job codec (orjson) writes
    as JSON itself: no Python floats in between, and each value in the shortest text that reads
    back as the same float32 (42 % fewer bytes than float64's, a quarter less time)."""
    vectors = np.ascontiguousarray(embeddings, dtype=np.float32)
    outputs: list[dict[str, Any]] = []
    start = 0
    for count in counts:
        outputs.append({"embeddings": vectors[start : start + count]})
        start += count
    return outputs


@dataclass(frozen=True, slots=True)
class TextCalls:
    """A micro-batch's texts tokenised into engine calls of at most `max_texts_per_call` texts,
    and how many texts each job brought (to hand the vectors back per job)."""

    counts: list[int]
    calls: list[TokenBatch]


@dataclass(frozen=True, slots=True)
class PooledCalls:
    """The sentence vectors of each call of a `TextCalls`, in order."""

    counts: list[int]
    vectors: list[np.ndarray]

    def per_job(self) -> list[dict[str, Any]]:
        if not self.vectors:
            return split_per_job(np.zeros((0, 0), dtype=np.float32), self.counts)
        return split_per_job(np.concatenate(self.vectors), self.counts)


def tokenize_jobs(
    inputs: list[dict[str, Any]], encoder: TextEncoder, max_texts_per_call: int
) -> TextCalls:
    """Host work before the engine: one call per micro-batch unless it holds more than
    `max_texts_per_call` texts."""
    texts, counts = flatten_texts(inputs)
    return TextCalls(counts, [encoder.tokenize(part) for part in chunks(texts, max_texts_per_call)])


def pool_calls(calls: TextCalls, run: Callable[[TokenBatch], np.ndarray]) -> PooledCalls:
    """Each call through the backend's `run` (token batch → hidden states), then pooled."""
    return PooledCalls(
        calls.counts,
        [mean_pool_normalize(run(batch), batch.attention_mask) for batch in calls.calls],
    )


def embed_jobs(
    inputs: list[dict[str, Any]],
    encoder: TextEncoder,
    run: Callable[[TokenBatch], np.ndarray],
    max_texts_per_call: int,
) -> list[dict[str, Any]]:
    """The whole `infer` of an encoder engine, given the backend's `run`."""
    return pool_calls(tokenize_jobs(inputs, encoder, max_texts_per_call), run).per_job()
