"""A minilm `artifact` in a subfolder of the model's artifact folder (`onnx/model.onnx`, which
the config allows): what a killed export left beside the graph, 90 MB a kill, was never removed,
as only the artifact folder itself was looked through. Tiny stand-in files: the cached path."""

from __future__ import annotations

from pathlib import Path

from tests.minilm_reference import minilm_config
from workers.engines.text_encoding import TOKENIZER_FILE
from workers.model_prep import minilm
from workers.model_prep.prepared_stamp import write_stamp


def test_the_temporaries_a_killed_run_left_beside_a_subfolder_artifact_go(tmp_path: Path) -> None:
    out_dir = tmp_path / "minilm"
    graph = out_dir / "onnx" / "model.onnx"
    graph.parent.mkdir(parents=True)
    for path in (graph, out_dir / TOKENIZER_FILE, *(out_dir / name for name in minilm.TORCH_FILES)):
        path.write_bytes(b"finished")
    write_stamp(out_dir, minilm.source_of(graph.name))
    leftover = graph.with_name(".model.onnx.4242.tmp")
    leftover.write_bytes(b"half")
    config = minilm_config().model_copy(update={"artifact": "onnx/model.onnx"})

    minilm.prepare(config, out_dir, False)

    assert sorted(path.name for path in graph.parent.iterdir()) == ["model.onnx"]
    assert graph.read_bytes() == b"finished"  # served from cache, not built again
