"""`specrt quantize --mode int8 --backend onnxruntime` on the demo bundle, and the line `generate` /
`bench` print for a quantized bundle on a backend its graphs were not made for.

onnxruntime's int8 is MatMulNBits with 8-bit weights (no calibration), whose accuracy-level-4
kernel quantizes each row's activations by themselves. What must hold: every linear layer of
every target and draft graph is 8-bit, the sampling head and the attention products stay float,
the manifest says which backends the graphs are made for, and a row's output does not depend on
the other rows of the call (as it would with onnxruntime's dynamic MatMulInteger, one activation
scale per call: an image would depend on its batch-mates, a verified position on later drafts).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from specrt.bench.onnx_profile import weight_bytes
from specrt.engines.quantize import backend_advice
from specrt.manifest import read_manifest
from specrt.runtime.pipeline import Pipeline
from test_quantize import QUANTIZED_OPS, float_linear_layers, head_ops, ops, run_cli



@pytest.fixture(scope="module")
def int8_bundle(demo_bundle: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q") / "int8"
    assert run_cli(["quantize", str(demo_bundle), "--mode", "int8", "--backend", "onnxruntime", "--out", str(out),
                    "--graphs", "target_prefill,target_step,draft_prefill,draft_step", "--no-progress"]) == 0
    return out


@pytest.fixture
def qdq_labelled_copy(int8_bundle: Path, tmp_path) -> Path:
    """The int8 bundle with its records as a ModelOpt int8 bundle of an earlier version wrote them
    (tool modelopt, no `backends`): what the runtime's warning reads is the manifest alone."""
    copy = tmp_path / "qdq"
    shutil.copytree(int8_bundle, copy)
    raw = json.loads((copy / "manifest.json").read_text())
    for graph in raw["graphs"].values():
        if graph.get("quantization"):
            graph["quantization"] = {"precision": "int8", "tool": "modelopt", "tool_version": "0.47.0",
                                     "algorithm": "QDQ, calibration max", "calibration_feeds": 32}
    (copy / "manifest.json").write_text(json.dumps(raw))
    return copy


def test_every_linear_layer_is_8_bit_and_the_head_stays_float(demo_bundle, int8_bundle):
    manifest, source = read_manifest(int8_bundle), read_manifest(demo_bundle)
    for name in ("target_prefill", "target_step", "draft_prefill", "draft_step"):
        record = manifest.graph(name).quantization
        assert record["precision"] == "int8" and record["tool"] == "onnxruntime" and record["tool_version"]
        assert record["bits"] == 8 and record["block_size"] == 128 and record["accuracy_level"] == 4
        assert record["backends"] == ["ort", "ort-cpu"] and record["calibration_feeds"] == 0
        path = manifest.graph_path(name)
        layers = [n for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulNBits"]
        n_layer = manifest.models[name.split("_")[0]]["n_layer"]
        assert len(layers) == 5 * n_layer + 1  # wqkv, wo, w1, w2, w3 a layer; the output head
        assert all(onnx.helper.get_node_attr_value(n, "bits") == 8 for n in layers)
        assert float_linear_layers(path) == 0
        assert "MatMul" in ops(path)  # the attention products (and the head's CFG mix) stay float
        assert not head_ops(path) & QUANTIZED_OPS and {"Softmax", "CumSum"} <= head_ops(path)
        assert manifest.graph(name).inputs == source.graph(name).inputs
        assert manifest.graph(name).outputs == source.graph(name).outputs
        # a step reads 1 byte a linear weight, not 4 (the demo target: a third of the bytes, its tiny
        # draft a half: RoPE tables and norms stay fp32)
        assert weight_bytes(onnx.load(str(path))) < 0.6 * weight_bytes(onnx.load(str(source.graph_path(name))))
    assert manifest.files["vq_decode.onnx"] == source.files["vq_decode.onnx"]


def row_zero_moves_with_row_one(path: Path, feed: dict) -> float:
    """Largest change of row 0's logits when only row 1's token (the CFG partner) changes."""
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    other = {**feed, "input_ids": feed["input_ids"].copy()}
    other["input_ids"][1] = (other["input_ids"][1] + 7) % 64
    first, second = (session.run(["logits"], f)[0] for f in (feed, other))
    assert np.abs(first[1] - second[1]).max() > 0  # row 1 itself did change
    return float(np.abs(first[0] - second[0]).max())


def test_a_rows_output_does_not_depend_on_the_other_rows(demo_bundle, int8_bundle, tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    from specrt.engines.calibration import record_feeds

    source = read_manifest(demo_bundle)
    feed = record_feeds(source, size=1, images=1)["target_step"][0]  # a real CFG pair's step
    assert row_zero_moves_with_row_one(read_manifest(int8_bundle).graph_path("target_step"), feed) == 0
    # the control: onnxruntime's dynamic int8 (one activation scale a call) couples the rows
    dynamic = tmp_path / "dynamic.onnx"
    quantize_dynamic(str(source.graph_path("target_step")), str(dynamic), op_types_to_quantize=["MatMul"])
    assert row_zero_moves_with_row_one(dynamic, feed) > 1e-3


def test_int8_target_stays_close_to_fp32(demo_bundle, int8_bundle):
    """Greedy AR tokens of the int8 target nearly all agree with fp32 (int4 here: ~0.6; a broken
    quantizer: ~1/512): one token that differs changes every one after it."""
    kwargs = dict(method="ar", seed=0, temperature=0.0)
    fp32 = Pipeline.from_bundle(demo_bundle, threads=1).generate(list(range(4)), **kwargs).tokens
    int8 = Pipeline.from_bundle(int8_bundle, threads=1).generate(list(range(4)), **kwargs).tokens
    assert (fp32 == int8).mean() > 0.8


def test_no_warning_on_the_backend_the_graphs_are_made_for(int8_bundle, tmp_path, capsys):
    assert run_cli(["generate", str(int8_bundle), "--class", "3", "--out", str(tmp_path / "a.png")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_generate_warns_in_one_line_on_another_backend(qdq_labelled_copy, tmp_path, capsys):
    out = tmp_path / "a.png"
    assert run_cli(["generate", str(qdq_labelled_copy), "--class", "3", "--backend", "ort", "--out", str(out)]) == 0
    assert out.is_file()  # a warning, not an error
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "made by modelopt for trt, ort-trt" in warnings[0] and "slower" in warnings[0]
    assert "--mode int8 --backend onnxruntime" in warnings[0]


def test_bench_warns_in_one_line_on_another_backend(qdq_labelled_copy, tmp_path, capsys):
    assert run_cli(["bench", str(qdq_labelled_copy), "--methods", "ar", "--images", "1", "--no-progress",
                    "--cache-dir", str(tmp_path / "cache")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "on --backend ort they run slower" in warnings[0]


def test_backend_advice_names_the_quantizer_for_the_backend_at_hand():
    def bundle(tool: str, precision: str) -> dict:
        return {"graphs": {"target_step": {"quantization": {"tool": tool, "precision": precision}}, "vq_decode": {}}}

    assert backend_advice(bundle("onnxruntime", "int8"), "b", "ort") is None
    assert backend_advice(bundle("onnxruntime", "int4"), "b", "ort-cuda") is None
    assert backend_advice(bundle("modelopt", "int8"), "b", "trt") is None
    assert backend_advice(bundle("modelopt", "int8"), "b", "torch") is None  # no quantizer targets it
    assert backend_advice({"graphs": {"target_step": {}}}, "b", "ort") is None  # not quantized
    int4_on_trt = backend_advice(bundle("onnxruntime", "int4"), "b", "trt")
    assert "--backend ort or ort-cpu or ort-cuda" in int4_on_trt and "--mode int4 --backend modelopt" in int4_on_trt
    fp8_on_ort = backend_advice(bundle("modelopt", "fp8"), "b", "ort")
    assert "--backend trt or ort-trt" in fp8_on_ort and "specrt quantize" not in fp8_on_ort  # onnxruntime has no fp8


def test_inspect_reports_the_int8_bundle_as_onnxruntime_only(int8_bundle, capsys):
    """MatMulNBits is onnxruntime's own op: notes (the graphs are made for onnxruntime), exit 0;
    --require-trt makes them errors."""
    assert run_cli(["inspect", str(int8_bundle)]) == 0
    out = capsys.readouterr().out
    assert "0 error(s), 0 warning(s), 4 note(s)" in out  # one per quantized graph
    assert "MatMulNBits (21 nodes) is onnxruntime's own op" in out and "--backend modelopt" in out
    assert run_cli(["inspect", str(int8_bundle), "--require-trt"]) == 1
