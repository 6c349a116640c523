"""The export path of checkpoints at the size they ship, on a tiny model (the 1B figure is
bench/export_memory.py's, docs/large-models.md).

- External data: with the threshold lowered to 0 every graph's weights go to `<graph>.onnx.data`,
  written once by the exporter and never loaded back (onnx.load only ever reads graph protos);
  the bundle holds exactly the files its manifest lists and hashes, and generates the same
  greedy tokens as the bundle with inline weights.
- float16 weights: past_kv / present_kv are float16 in the graphs and in the manifest (the
  runtime allocates its cache from it), logits / hidden / the head stay float32, and the
  bundle runs on onnxruntime CPU with greedy tokens mostly those of float32.
- bfloat16: said in one line at export time (onnxruntime CPU has no bfloat16 kernels).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from unified_fixtures import tiny_emu3, one_torch_thread  # noqa: F401 (autouse)
from specrt.export import onnx_export
from specrt.export.bundle import ExportOptions
from specrt.export.unified.sources import unified_models
from specrt.export.unified.writer import BFLOAT16_NOTE, write_unified_bundle
from specrt.runtime.pipeline import Pipeline

pytest.importorskip("transformers")
OPTIONS = ExportOptions(max_window=8, max_batch=2)
GRID, PROMPT_TOKENS = (4, 4), 40
PROMPTS = ["a thin two", "the red seven", "one"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_emu3(tmp_path_factory.mktemp("large") / "emu3")


def _write(checkpoint: Path, out: Path, dtype: str = "float32", progress=None) -> Path:
    models = unified_models(checkpoint, grid=GRID, cond_len=PROMPT_TOKENS, dtype=dtype)
    write_unified_bundle(models, out, OPTIONS, progress=progress)
    return out


@pytest.fixture(scope="module")
def float32_bundle(checkpoint, tmp_path_factory) -> Path:
    return _write(checkpoint, tmp_path_factory.mktemp("large") / "float32")


def _greedy(bundle: Path) -> np.ndarray:
    pipe = Pipeline.from_bundle(bundle, threads=1)
    return pipe.generate(prompts=PROMPTS, method="ar", temperature=0, cfg_scale=3.0).stream


def test_external_data_is_written_once_and_never_loaded_back(checkpoint, float32_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_BYTES", 0)
    real_load, data_loads = onnx.load, []

    def spy(f, *args, **kwargs):
        data_loads.append(kwargs.get("load_external_data", args[1] if len(args) > 1 else True))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", spy)
    out = _write(checkpoint, tmp_path / "external")
    monkeypatch.undo()
    assert data_loads and not any(data_loads)  # graph protos only: the weights were never read back

    raw = json.loads((out / "manifest.json").read_text())
    for graph in raw["graphs"].values():
        data = graph["external_data"]
        assert data == f"{graph['file']}.data" and data in raw["files"]
        model = onnx.load(str(out / graph["file"]), load_external_data=False)
        external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert external, graph["file"]
        assert {e.value for t in external for e in t.external_data if e.key == "location"} == {data}
    # exactly the files the manifest lists and hashes: no stray file of the exporter's
    assert sorted(p.name for p in out.iterdir()) == sorted([*raw["files"], "manifest.json"])
    assert np.array_equal(_greedy(out), _greedy(float32_bundle))


def _io_dtypes(raw: dict) -> dict[tuple[str, str], str]:
    return {(name, t["name"]): t["dtype"] for name, graph in raw["graphs"].items()
            for t in graph["inputs"] + graph["outputs"]}


def test_float16_bundle_runs_on_onnxruntime_cpu(checkpoint, float32_bundle, tmp_path):
    out = _write(checkpoint, tmp_path / "float16", dtype="float16")
    raw = json.loads((out / "manifest.json").read_text())
    io = _io_dtypes(raw)
    assert io["target_prefill", "present_kv"] == io["target_step", "present_kv"] == "float16"
    assert io["target_step", "past_kv"] == "float16"
    for graph in ("target_prefill", "target_step"):
        for name in ("logits", "hidden", "probs", "mix", "uniforms"):
            assert io[graph, name] == "float32", (graph, name)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    weights = [t for t in onnx.load(str(out / "target_step.onnx")).graph.initializer
               if t.data_type in floats and int(np.prod(t.dims)) >= 256]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)

    pipe = Pipeline.from_bundle(out, threads=1)
    half, full = _greedy(out), _greedy(float32_bundle)
    assert half.shape == full.shape and (half == full).mean() >= 0.8
    result = pipe.generate(prompts=PROMPTS[:2], method="sjd", seed=0, window=4)
    assert pipe.grammar.is_valid(result.stream).all()


class _Stop(Exception):
    pass


def test_bfloat16_says_where_it_runs(checkpoint, tmp_path):
    said = []

    def progress(line: str) -> None:
        said.append(line)
        if line == BFLOAT16_NOTE:
            raise _Stop  # before any graph is exported

    with pytest.raises(_Stop):
        _write(checkpoint, tmp_path / "bfloat16", dtype="bfloat16", progress=progress)
    assert "onnxruntime CPU" in BFLOAT16_NOTE and "float16" in BFLOAT16_NOTE
    assert not (tmp_path / "bfloat16").exists()
