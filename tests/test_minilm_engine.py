"""The minilm example on ONNX Runtime: the offline export serves the same vectors as the PyTorch
weights (as sentence-transformers computes them), per text, whatever the micro-batch around it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

from shared.codec import dumps, loads
from tests.minilm_reference import (
    DIMENSION,
    MAX_SEQ_LENGTH,
    NO_TOKENS,
    SENTENCES,
    assert_base64_beside_numbers,
    assert_served_as_float32,
    assert_usage_counts_tokens,
    minilm_config,
    model_dir,
    prepared_artifacts,
    recording_engine,
    reference_embeddings,
    vectors,
)
from tests.stage_overlap import trace_two_micro_batches
from workers.engines.onnxruntime_engine import OnnxRuntimeEngine, provider_specs
from workers.engines.registry import create_engine
from workers.model_prep.minilm import prepare

SHORT_TEXTS = ["hi", "a cat", "queues and workers", "one more short sentence here"]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    return prepared_artifacts()


def make_engine(artifacts: Path, **parameters: Any) -> OnnxRuntimeEngine:
    config = minilm_config()
    config = config.model_copy(update={"parameters": {**config.parameters, **parameters}})
    return recording_engine(OnnxRuntimeEngine, config, artifacts)


@pytest.fixture(scope="module")
def engine(artifacts: Path) -> OnnxRuntimeEngine:
    engine = make_engine(artifacts)
    engine.warmup()
    return engine


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return reference_embeddings(SENTENCES)


def test_embeddings_equal_the_pytorch_reference(engine, reference):
    engine.call_shapes.clear()
    outputs = engine.infer([{"texts": SENTENCES}])
    got = vectors(outputs)
    assert got.shape == (len(SENTENCES), DIMENSION)
    assert_served_as_float32(outputs[0])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = (got * reference).sum(axis=1)
    assert cosines.min() >= 0.999, dict(zip(SENTENCES, cosines.round(6), strict=True))
    # The long sentence was truncated to the model's limit, so the call was exactly that wide.
    assert engine.call_shapes == [(len(SENTENCES), MAX_SEQ_LENGTH)]


def test_reference_is_what_sentence_transformers_computes(reference):
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
    assert model.max_seq_length == MAX_SEQ_LENGTH
    expected = model.encode(SENTENCES, normalize_embeddings=True)
    assert (expected * reference).sum(axis=1).min() >= 0.99999


def test_padding_is_to_the_longest_text_of_the_micro_batch(engine):
    engine.call_shapes.clear()
    together = vectors(engine.infer([{"texts": SHORT_TEXTS}]))
    longest = max(len(engine.encoder.tokenize([t]).input_ids[0]) for t in SHORT_TEXTS)
    assert engine.call_shapes == [(len(SHORT_TEXTS), longest)]
    assert longest < 16
    alone = vectors([out for text in SHORT_TEXTS for out in engine.infer([{"texts": [text]}])])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_one_call_serves_every_job_and_splits_back_per_job(engine, reference):
    jobs = [{"texts": SENTENCES[:3]}, {"texts": [SENTENCES[3]]}, {"texts": SENTENCES[4:]}]
    engine.call_shapes.clear()
    outputs = engine.infer(jobs)
    assert len(engine.call_shapes) == 1
    assert [len(out["embeddings"]) for out in outputs] == [3, 1, len(SENTENCES) - 4]
    assert (vectors(outputs) * reference).sum(axis=1).min() >= 0.999


def test_a_huge_micro_batch_is_split_into_calls_of_bounded_size(artifacts, reference):
    """Each job's usage counts its own texts' tokens, whichever calls they ran in."""
    engine = make_engine(artifacts, max_texts_per_call=5)
    jobs = [{"texts": SENTENCES[:7]}, {"texts": SENTENCES[7:]}]
    outputs = engine.infer(jobs)
    assert [rows for rows, _ in engine.call_shapes] == [5, 5, 2]
    assert (vectors(outputs) * reference).sum(axis=1).min() >= 0.999
    assert_usage_counts_tokens(jobs, outputs)


def test_a_job_without_texts_gets_no_vectors(engine):
    outputs = engine.infer([{"texts": []}, {"texts": ["only me"]}])
    assert loads(dumps(outputs[0])) == {"embeddings": [], "usage": NO_TOKENS}
    assert len(outputs[1]["embeddings"]) == 1


def test_a_job_may_take_its_vectors_as_base64_beside_one_that_takes_numbers(engine):
    assert_base64_beside_numbers(engine)


def test_bad_input_raises_so_the_loop_can_isolate_it(engine):
    with pytest.raises(ValueError, match="list of strings"):
        engine.infer([{"texts": ["fine", 3]}])
    with pytest.raises(ValueError, match="list of strings"):
        engine.infer([{"text": "wrong key"}])
    with pytest.raises(ValueError, match="encoding_format must be one of float, base64"):
        engine.infer([{"texts": ["fine"], "encoding_format": "binary"}])
    for other in (["a list"], "a text", None):  # an AttributeError named no input
        with pytest.raises(ValueError, match="inputs must be an object with texts"):
            engine.infer([other])  # type: ignore[list-item]


def test_a_provider_that_is_not_installed_fails_loudly(artifacts):
    with pytest.raises(RuntimeError, match="NoSuchExecutionProvider"):
        make_engine(artifacts, providers=[{"NoSuchExecutionProvider": {"device_id": 0}}])
    with pytest.raises(RuntimeError, match=r"\['NoSuchExecutionProvider'\]"):  # not ['N', ...]
        make_engine(artifacts, providers="NoSuchExecutionProvider")


@pytest.mark.filterwarnings("ignore:Specified provider .CUDAExecutionProvider.")
def test_a_gpu_provider_the_session_fell_back_from_fails_the_load(artifacts, monkeypatch):
    """The onnxruntime-gpu wheel always lists CUDA as available; without cuDNN or a visible GPU
    ONNX Runtime only warns and builds a CPU session, and a GPU pool served on the CPU. Here the
    CPU wheel is told CUDA is available: its session falls back to the CPU the same way."""
    available = [*ort.get_available_providers(), "CUDAExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: available)
    fell_back = (
        r"got providers \['CPUExecutionProvider'\], not the requested \['CUDAExecutionProvider'\]"
    )
    with pytest.raises(RuntimeError, match=fell_back):
        make_engine(artifacts, providers=["CUDAExecutionProvider"])


def test_providers_as_a_mapping_keep_their_options():
    """A mapping was iterated as its names: `{CUDAExecutionProvider: {device_id: 1}}` ran on
    device 0. Anything else than a name, a list or a mapping names the setting, as do options
    that are no mapping (a TypeError that named nothing)."""
    options = {"arena_extend_strategy": "kSameAsRequested"}
    assert provider_specs({"CPUExecutionProvider": options}) == [("CPUExecutionProvider", options)]
    with pytest.raises(ValueError, match="providers"):
        provider_specs(5)
    for options in (0, "kSameAsRequested", [1]):
        with pytest.raises(ValueError, match=r"providers entry .* neither a name nor"):
            provider_specs({"CPUExecutionProvider": options})


def test_one_provider_named_alone_is_a_list_of_it(artifacts):
    engine = make_engine(artifacts, providers="CPUExecutionProvider")
    assert len(engine.infer([{"texts": ["a provider named alone"]}])[0]["embeddings"]) == 1


def test_automatic_intra_op_threads_fit_the_cgroup_cpu_quota(artifacts, tmp_path, monkeypatch):
    """`intra_op_threads: 0` under a 1-CPU quota (a k8s CPU limit): ONNX Runtime alone would
    start a thread per host core; the session gets the quota's 1. Without a quota (nor an
    affinity mask) narrowing the machine, 0 stays the runtime's own choice. A set count stays
    as set."""
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    monkeypatch.setattr("shared.cpu_count.CGROUP_ROOT", tmp_path)
    automatic = make_engine(artifacts, intra_op_threads=0).session.get_session_options()
    assert automatic.intra_op_num_threads == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    if len(os.sched_getaffinity(0)) == os.cpu_count():
        unlimited = make_engine(artifacts, intra_op_threads=0).session.get_session_options()
        assert unlimited.intra_op_num_threads == 0
    assert (
        make_engine(artifacts, intra_op_threads=3)
        .session.get_session_options()
        .intra_op_num_threads
        == 3
    )


def test_a_max_seq_length_past_the_models_positions_is_refused_at_load(artifacts):
    """Every text longer than the model's 512 positions used to fail in the session, as a job
    error naming an ONNX broadcast; the worker now refuses to start and says why."""
    with pytest.raises(ValueError, match="max_seq_length 513 exceeds the model's 512 positions"):
        make_engine(artifacts, max_seq_length=513).load()


class StandInSession:
    """The engine's real CPU session, reporting `providers`; `fault` stands for a CUDA error
    that poisoned the device (ONNX Runtime raises its `Fail`, an Exception)."""

    def __init__(self, session: Any, providers: list[str], fault: Exception | None) -> None:
        self.session = session
        self.providers = providers
        self.fault = fault
        self.runs = 0

    def get_providers(self) -> list[str]:
        return self.providers

    def run(self, names: Any, feeds: dict[str, np.ndarray]) -> Any:
        self.runs += 1
        if self.fault is not None:
            raise self.fault
        return self.session.run(names, feeds)


CUDA_FAULT = Fail("CUDA failure 700: an illegal memory access was encountered")
ON_CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("providers", "fault", "dead", "probes"),
    [
        (ON_CUDA, CUDA_FAULT, True, 1),  # every queued job used to be bisected and failed
        (ON_CUDA, None, False, 1),  # the micro-batch failed on its own input
        (["TensorrtExecutionProvider", "CPUExecutionProvider"], CUDA_FAULT, True, 1),
        (["CPUExecutionProvider"], CUDA_FAULT, False, 0),  # a CPU fails only on its input
    ],
)
def test_a_session_on_a_faulted_gpu_is_dead(artifacts, providers, fault, dead, probes):
    engine = make_engine(artifacts)
    session = StandInSession(engine.session, providers, fault)
    engine.session = session  # type: ignore[assignment]
    assert engine.dead() is dead
    assert session.runs == probes


def test_the_registry_builds_this_engine_for_the_minilm_config(artifacts):
    engine = create_engine(minilm_config(), "default", artifacts.parent)
    assert isinstance(engine, OnnxRuntimeEngine)
    assert Path(engine.artifact_dir) == artifacts


def test_prepare_keeps_cached_artifacts_unless_forced(artifacts):
    onnx_path = artifacts / "model.onnx"
    before = onnx_path.stat().st_mtime_ns
    prepare(minilm_config(), artifacts, False)
    assert onnx_path.stat().st_mtime_ns == before
    assert not [p.name for p in artifacts.iterdir() if p.name.endswith(".tmp")]


async def test_the_next_micro_batch_is_tokenised_while_the_session_runs(artifacts, monkeypatch):
    """Staged like the PyTorch engine: the batching loop tokenises micro-batch n+1 (on the one
    host thread) while the session runs n (on its own thread), and the vectors still come back."""
    engine = make_engine(artifacts)
    trace = await trace_two_micro_batches(engine, monkeypatch)
    assert trace.overlapped == [True, True]
    assert trace.errors() == [[None], [None]]
    assert trace.threads["run"] == {"engine-device_0"}
    assert trace.threads["prepare"] | trace.threads["finish"] <= {"engine-host_0"}
    # micro-batch 1 was read and tokenised while 0 ran: its jobs waited until the device was free
    assert trace.outcomes[1][0].ran_ms >= trace.run_ended_ms[0]
    vector = np.array(trace.outcomes[1][0].output["embeddings"])  # type: ignore[index]
    np.testing.assert_allclose(vector, reference_embeddings(["the next micro-batch"]), atol=1e-4)
