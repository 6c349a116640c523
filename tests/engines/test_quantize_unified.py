"""`specrt quantize` on a unified-vocabulary bundle (a tiny Emu3 checkpoint exported without a draft).

What must hold beyond the LlamaGen bundles' checks (test_quantize.py): the default `--graphs
target,draft` works on a bundle without a draft (its target is quantized); the manifest keeps
"family": "unified", the grammar keys and the "prompt" block, and still lists and hashes the
tokenizer; `--self-draft int4` gives a draft of the target's own grammar; both bundles generate
(ar, sd) with every stream valid under the grammar; a float16 bundle quantizes too.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from unified_fixtures import one_torch_thread, tiny_emu3  # noqa: E402, F401 (one_torch_thread: autouse)

from specrt.engines.quantize import QuantizeOptions, quantize_bundle  # noqa: E402
from specrt.export.bundle import ExportOptions  # noqa: E402
from specrt.export.unified.sources import unified_models  # noqa: E402
from specrt.export.unified.writer import write_unified_bundle  # noqa: E402
from specrt.manifest import read_manifest  # noqa: E402
from specrt.runtime.pipeline import Pipeline  # noqa: E402

pytest.importorskip("transformers")
PROMPTS = ["a thin two", "the red seven"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_emu3(tmp_path_factory.mktemp("qu") / "emu3")


def _export(checkpoint: Path, out: Path, dtype: str = "float32") -> Path:
    models = unified_models(checkpoint, grid=(4, 4), cond_len=40, dtype=dtype)
    write_unified_bundle(models, out, ExportOptions(max_window=8, max_batch=2))
    return out


@pytest.fixture(scope="module")
def bundle(checkpoint, tmp_path_factory) -> Path:
    return _export(checkpoint, tmp_path_factory.mktemp("qu") / "bundle")


def _matmul_nbits(path: Path) -> int:
    return sum(n.op_type == "MatMulNBits" for n in onnx.load(str(path)).graph.node)


def _check_unified_manifest(source: Path, out: Path) -> dict:
    before, after = (json.loads((p / "manifest.json").read_text()) for p in (source, out))
    assert after["family"] == "unified" and after["prompt"] == before["prompt"]
    assert after["models"]["target"] == before["models"]["target"] and after["models"]["vq"] == before["models"]["vq"]
    assert after["files"]["tokenizer.json"] == before["files"]["tokenizer.json"]
    read_manifest(out)  # every listed file is there with its hash
    return after


def test_int4_of_a_bundle_without_a_draft(bundle, tmp_path):
    out = tmp_path / "int4"
    quantize_bundle(bundle, out, QuantizeOptions(mode="int4"))  # the default graphs: target, draft
    raw = _check_unified_manifest(bundle, out)
    assert "draft" not in raw["models"]
    for name in ("target_prefill", "target_step"):
        assert raw["graphs"][name]["quantization"]["precision"] == "int4"
        assert _matmul_nbits(out / f"{name}.onnx") > 0
    pipe = Pipeline.from_bundle(out, threads=1)
    result = pipe.generate(prompts=PROMPTS, method="ar", temperature=0, cfg_scale=3.0)
    full = Pipeline.from_bundle(bundle, threads=1).generate(prompts=PROMPTS, method="ar", temperature=0, cfg_scale=3.0)
    assert pipe.grammar.is_valid(result.stream).all()
    assert (result.stream == full.stream).mean() >= 0.5  # a new (quantized) target, close to the float one
    result = pipe.generate(prompts=PROMPTS, method="sjd", seed=0, window=4)
    assert pipe.grammar.is_valid(result.stream).all()


def test_self_draft_int4_generates_with_sd(bundle, tmp_path):
    out = tmp_path / "self-int4"
    quantize_bundle(bundle, out, QuantizeOptions(mode="int4"), self_draft=True)
    raw = _check_unified_manifest(bundle, out)
    draft = raw["models"]["draft"]
    assert draft["kind"] == "self" and draft["quantization"] == "int4" and draft["family"] == "unified"
    assert all(draft[k] == raw["models"]["target"][k] for k in ("vocab_size", "stream_len", "row_end", "cond_len"))
    assert _matmul_nbits(out / "draft_step.onnx") > 0 and _matmul_nbits(out / "target_step.onnx") == 0
    pipe = Pipeline.from_bundle(out, threads=1)
    result = pipe.generate(prompts=PROMPTS, method="sd", seed=0, draft_len=4)
    assert pipe.grammar.is_valid(result.stream).all()
    assert result.stats.mean_accepted_length > 1  # the int4 copy mostly agrees with its target
    greedy = pipe.generate(prompts=PROMPTS, method="sd", temperature=0, cfg_scale=3.0, draft_len=4)
    target = Pipeline.from_bundle(bundle, threads=1).generate(prompts=PROMPTS, method="ar", temperature=0,
                                                                cfg_scale=3.0)
    assert np.array_equal(greedy.stream, target.stream)  # lossless: the float target decides


def test_float16_bundle_quantizes(checkpoint, tmp_path):
    half = _export(checkpoint, tmp_path / "float16", dtype="float16")
    out = tmp_path / "float16-self-int4"
    quantize_bundle(half, out, QuantizeOptions(mode="int4"), self_draft=True)
    assert _matmul_nbits(out / "draft_step.onnx") > 0
    pipe = Pipeline.from_bundle(out, threads=1)
    result = pipe.generate(prompts=PROMPTS, method="sd", seed=0, draft_len=4)
    assert pipe.grammar.is_valid(result.stream).all()
