"""Tokenisation and pooling for sentence-encoder engines, shared so that every backend (ONNX
Runtime, TensorRT) turns the same texts into the same vectors as sentence-transformers does."""

from __future__ import annotations

from base64 import b64encode
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tokenizers import Encoding, Tokenizer

from shared.generate_errors import ContextLengthExceeded
from shared.job_parameters import TRUNCATE
from workers.engines.base import FailedJob

TOKENIZER_FILE = "tokenizer.json"
MODEL_CONFIG_FILE = "config.json"  # the Hugging Face model's, beside its weights
POSITIONS = "max_position_embeddings"
# Model types whose position ids count on from the padding index (RoBERTa's scheme in
# transformers): the first `pad_token_id + 1` positions are no token's, so XLM-R's 514 hold 512.
PADDED_POSITIONS = frozenset(
    {
        "camembert",
        "data2vec-text",
        "ibert",
        "longformer",
        "mpnet",
        "roberta",
        "roberta-prelayernorm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)
ROBERTA_PAD_ID = 1  # their configs' default pad_token_id
# Upper bound on texts per engine call: a micro-batch of 32 jobs may carry 256 texts each, and one
# padded call over all of them could need gigabytes of activations.
DEFAULT_MAX_TEXTS_PER_CALL = 256
# A job's `inputs.encoding_format`, as in OpenAI's embeddings API: JSON numbers, or each text's
# vector as base64 of its little-endian float32 bytes.
ENCODINGS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class AtLimit:
    """The rows of one engine call as long as `max_seq_length`, which truncation may have cut,
    with their encodings, and how many special tokens the tokenizer adds to each piece of a
    cut text. A text's whole length is read from its overflow only when asked (for a job that
    refuses a cut text): reading it took 4 % of a long micro-batch's tokenisation."""

    rows: dict[int, Encoding] = field(default_factory=dict)
    added: int = 0

    def whole_tokens(self, row: int) -> int | None:
        """The row's text's tokens, special ones included, if truncation cut it; else None."""
        encoding = self.rows.get(row)
        if encoding is None or not encoding.overflowing:
            return None
        pieces = encoding.overflowing
        return len(encoding.ids) + sum(len(piece.ids) - self.added for piece in pieces)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Encoder inputs of one engine call, padded to the longest text of that call, and its
    texts that truncation may have cut (`at_limit`)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    at_limit: AtLimit = field(default_factory=AtLimit)

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


def check_positions(artifact_dir: Path, setting: str, tokens: int) -> None:
    """Refuse `tokens` per text (named by its `setting`) past the model's position embeddings,
    read from its config.json where the artifacts have one: a wider input fails in the model."""
    config = artifact_dir / MODEL_CONFIG_FILE
    positions, skipped = _positions(config) if config.is_file() else (None, 0)
    if positions is not None and tokens > positions - skipped:
        less = f" less the {skipped} before its first token" if skipped else ""
        raise ValueError(
            f"{setting} {tokens} exceeds the model's {positions - skipped} positions "
            f"({POSITIONS} in {config}{less})"
        )


def _positions(config: Path) -> tuple[int | None, int]:
    """The config's position count, if it names one, and how many of them no token fills. A
    file that is no JSON object (a Git LFS pointer left by a clone without LFS, a cut download)
    or a count that is no integer is refused naming the file: the worker's start failed with
    the parser's bare message."""
    try:
        fields = orjson.loads(config.read_bytes())
        positions = fields.get(POSITIONS)
    except (orjson.JSONDecodeError, AttributeError) as exc:  # not JSON, or JSON but no object
        raise ValueError(f"{config} is not a JSON object: {exc}") from exc
    if positions is not None and type(positions) is not int:
        raise ValueError(f"{config} has {POSITIONS} {positions!r}, not an integer")
    return positions, _skipped_positions(fields)


def _skipped_positions(fields: dict[str, Any]) -> int:
    """Positions before a RoBERTa-like model's first token (its padding index and those below):
    counted as the text's, a max_seq_length of all 514 of XLM-R's passed, and every text longer
    than 512 tokens failed its job with an index out of range instead of being truncated."""
    model_type = fields.get("model_type")
    if not isinstance(model_type, str) or model_type not in PADDED_POSITIONS:
        return 0
    pad = fields.get("pad_token_id")
    return (pad if type(pad) is int else ROBERTA_PAD_ID) + 1


class TextEncoder:
    """The fast (Rust) tokenizer of the model, truncating like sentence-transformers'
    `max_seq_length` (special tokens included) and padding per call rather than to a fixed size."""

    def __init__(self, tokenizer: Tokenizer, max_seq_length: int) -> None:
        self.max_seq_length = max_seq_length
        self._tokenizer = tokenizer
        self._added = tokenizer.num_special_tokens_to_add(is_pair=False)
        tokenizer.enable_truncation(max_length=max_seq_length)
        # tokenizer.json pads every text to a fixed 128; padding happens per call in `tokenize`.
        tokenizer.no_padding()

    @classmethod
    def from_artifacts(cls, artifact_dir: Path, max_seq_length: int) -> TextEncoder:
        """Refuses a `max_seq_length` past the model's positions (its config.json, where the
        artifacts have one): every longer text would fail in the engine, one job at a time."""
        check_positions(artifact_dir, "max_seq_length", max_seq_length)
        return cls(Tokenizer.from_file(str(artifact_dir / TOKENIZER_FILE)), max_seq_length)

    def tokenize(
        self, texts: Sequence[str], pad_to: int | None = None, widths: Sequence[int] = ()
    ) -> TokenBatch:
        """Tokenise `texts`, padded to the longest of them, or to the first of the ascending
        `widths` that holds it (a CUDA graph's shape bucket), or padded or cut to exactly
        `pad_to` tokens (for a fixed shape, like INT8 calibration's)."""
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        longest = max(lengths)
        width = pad_to or next((w for w in widths if w >= longest), longest)
        return TokenBatch(
            input_ids=_matrix([e.ids for e in encodings], width),
            attention_mask=_matrix([e.attention_mask for e in encodings], width),
            token_type_ids=_matrix([e.type_ids for e in encodings], width),
            at_limit=self._at_limit(encodings, lengths),
        )

    def _at_limit(self, encodings: list[Encoding], lengths: list[int]) -> AtLimit:
        """The texts as long as `max_seq_length`: only they may have been cut."""
        limit = self.max_seq_length
        rows = {
            row: e for row, (e, n) in enumerate(zip(encodings, lengths, strict=True)) if n >= limit
        }
        return AtLimit(rows, self._added) if rows else AtLimit()


def _matrix(rows: list[list[int]], width: int) -> np.ndarray:
    """Rows as one int64 matrix (the exported graph's input type), zero-padded (the pad id and
    a zero attention mask) or cut to `width`."""
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:width]
    return out


def mean_pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over real tokens, then L2 normalisation (same epsilons),
    so a vector does not depend on how much padding its batch needed. Padding is left out of the
    sum, not multiplied by zero: a NaN or infinity an fp16 engine computed at a padding position
    made the row's vector NaN, so a text failed beside a longer one and not alone."""
    real = attention_mask.astype(bool)[:, :, None]
    summed = np.where(real, hidden.astype(np.float32, copy=False), np.float32(0.0)).sum(axis=1)
    pooled = summed / np.clip(real.sum(axis=1, dtype=np.float32), 1e-9, None)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    result: np.ndarray = pooled / np.clip(norms, 1e-12, None)
    return result


@dataclass(frozen=True, slots=True)
class JobSplit:
    """How a micro-batch's vectors go back to its jobs: how many texts each brought, whether it
    asked for them as base64, (once tokenised, `counted`) how many tokens it had, and whether
    it refuses a text longer than the model reads (`whole`: its `truncate` parameter false)."""

    counts: list[int]
    base64: list[bool]
    tokens: list[int] = field(default_factory=list)
    whole: list[bool] = field(default_factory=list)
    refused: dict[int, Exception] = field(default_factory=dict)  # by job: its output's place

    def counted(self, calls: Iterable[tuple[TokenBatch, int]]) -> JobSplit:
        """This split with each job's tokens: what the model read of its texts (special tokens
        included, after truncation), from each engine call's first `rows` rows (the rest pad a
        CUDA graph's shape). OpenAI's `usage.prompt_tokens` of an embeddings request."""
        per_text: list[int] = []
        at_limit: dict[int, tuple[AtLimit, int]] = {}
        for batch, rows in calls:
            limit = batch.at_limit
            at_limit.update((len(per_text) + row, (limit, row)) for row in limit.rows)
            per_text.extend(int(n) for n in batch.attention_mask[:rows].sum(1))
        bounds = list(pairwise(accumulate(self.counts, initial=0)))
        _refuse_tokenless(per_text, bounds)
        refused: dict[int, Exception] = {}
        if at_limit and any(self.whole):
            refused = _refused_cut(per_text, at_limit, bounds, self.whole)
        tokens = [sum(per_text[a:b]) for a, b in bounds]
        return JobSplit(self.counts, self.base64, tokens, self.whole, refused)

    def outputs(self, embeddings: np.ndarray) -> list[dict[str, Any]]:
        """One output per job in input order, with its `usage` as OpenAI counts it. As numbers:
        a float32 array the job codec (orjson) writes itself, no Python floats in between, each
        value in the shortest text that reads back as the same float32 (42 % fewer bytes than
        float64's, a quarter less time). As base64: half those bytes again, a fifth of the time
        to write and no numbers for anyone to parse, which is what keeps a GPU's worker from
        being the limit. A job's vectors that are not all finite stay numbers, whichever it asked
        for: the write-back fails a job on a NaN among its numbers, and base64 hid it there."""
        vectors = np.ascontiguousarray(embeddings, dtype="<f4")
        outputs: list[dict[str, Any]] = []
        start = 0
        for job, (count, as_base64, tokens) in enumerate(
            zip(self.counts, self.base64, self.tokens, strict=True)
        ):
            rows = vectors[start : start + count]
            start += count
            if refusal := self.refused.get(job):
                outputs.append(FailedJob(refusal))
                continue
            packed = as_base64 and bool(np.isfinite(rows).all())
            embedded = [b64encode(row.data).decode() for row in rows] if packed else rows
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            outputs.append({"embeddings": embedded, "usage": usage})
        return outputs


def _refuse_tokenless(per_text: list[int], bounds: list[tuple[int, int]]) -> None:
    """A text the tokenizer makes no token of (empty or whitespace only, with a tokenizer that
    adds no special tokens) fails its job by name: beside a longer text it was embedded as a
    zero vector, which no cosine can use, and alone it failed the model on a 0-wide input."""
    if 0 not in per_text:
        return
    empty = per_text.index(0)
    start = next(a for a, b in bounds if a <= empty < b)
    raise ValueError(
        f"inputs.texts[{empty - start}] has no tokens: the model's tokenizer adds no special "
        "tokens and makes none of this text (empty or whitespace only)"
    )


def _refused_cut(
    per_text: list[int],
    at_limit: dict[int, tuple[AtLimit, int]],
    bounds: list[tuple[int, int]],
    whole: list[bool],
) -> dict[int, Exception]:
    """The jobs that refuse a cut text (OpenAI's embeddings route asks it) and had one, each
    failed alone as vLLM's server refuses it: `ContextLengthExceeded`, which that route answers
    400. The model's context is what the cut text kept, `max_seq_length`."""
    refused: dict[int, Exception] = {}
    for job, (start, end) in enumerate(bounds):
        for text in (i for i in range(start, end) if whole[job] and i in at_limit):
            limit, row = at_limit[text]
            if (tokens := limit.whole_tokens(row)) is not None:
                refused[job] = ContextLengthExceeded(tokens, per_text[text], embedding=True)
                break
    return refused


def flatten_texts(inputs: list[dict[str, Any]]) -> tuple[list[str], JobSplit]:
    """All texts of a micro-batch in job order, and how to hand the vectors back per job, so one
    engine call serves every job."""
    texts: list[str] = []
    split = JobSplit([], [])
    for item in inputs:
        if not isinstance(item, dict):  # a model whose input_schema lets any JSON through
            raise ValueError(f"inputs must be an object with texts, not {type(item).__name__}")
        job_texts = item.get("texts")
        if not isinstance(job_texts, list) or not all(isinstance(t, str) for t in job_texts):
            raise ValueError("inputs.texts must be a list of strings")
        encoding = item.get("encoding_format", "float")
        if encoding not in ENCODINGS:
            raise ValueError(f"inputs.encoding_format must be one of {', '.join(ENCODINGS)}")
        texts.extend(job_texts)
        split.counts.append(len(job_texts))
        split.base64.append(encoding == "base64")
        split.whole.append(_refuses_cut(item))
    return texts, split


def _refuses_cut(item: dict[str, Any]) -> bool:
    """Whether the job's `truncate` parameter is false (`shared.job_parameters`, checked at
    submit): its texts are embedded whole or the job fails. A job with none truncates."""
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict) or type(parameters.get(TRUNCATE, True)) is not bool:
        raise ValueError(f"parameters.{TRUNCATE} must be a boolean")
    return parameters.get(TRUNCATE) is False


def chunks(texts: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


@dataclass(frozen=True, slots=True)
class TextCalls:
    """A micro-batch's texts tokenised into engine calls of at most `max_texts_per_call` texts,
    and how to hand the vectors back per job."""

    split: JobSplit
    calls: list[TokenBatch]


@dataclass(frozen=True, slots=True)
class PooledCalls:
    """The sentence vectors of each call of a `TextCalls`, in order."""

    split: JobSplit
    vectors: list[np.ndarray]

    def per_job(self) -> list[dict[str, Any]]:
        if not self.vectors:
            return self.split.outputs(np.zeros((0, 0), dtype=np.float32))
        return self.split.outputs(np.concatenate(self.vectors))


def tokenize_jobs(
    inputs: list[dict[str, Any]], encoder: TextEncoder, max_texts_per_call: int
) -> TextCalls:
    """Host work before the engine: one call per micro-batch unless it holds more than
    `max_texts_per_call` texts."""
    texts, split = flatten_texts(inputs)
    calls = [encoder.tokenize(part) for part in chunks(texts, max_texts_per_call)]
    return TextCalls(split.counted((call, call.shape[0]) for call in calls), calls)


def pool_calls(calls: TextCalls, run: Callable[[TokenBatch], np.ndarray]) -> PooledCalls:
    """Each call through the backend's `run` (token batch → hidden states), then pooled."""
    return PooledCalls(
        calls.split,
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
