"""`specrt inspect`: readable manifest, and a lint that catches what TensorRT 10.3 would reject."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specrt.export.lint import ERROR, NOTE, WARNING, lint_graph
from specrt.manifest import GraphSpec, TensorSpec, file_record
from tiny_export import cli_exit_code as _exit_code, tiny_bundle


@pytest.fixture(scope="module")
def bundle():
    return tiny_bundle()



def test_inspect_prints_graphs_io_profiles_and_a_clean_lint(bundle, capsys):
    manifest, _ = bundle
    assert _exit_code(["inspect", str(manifest.root)]) == 0
    out = capsys.readouterr().out
    for name in manifest.graphs:
        assert f"  {name}  ({name}.onnx" in out
    assert "attention_mask  bool     [batch, window, total_len]" in out
    assert "in   mix             float32  [images, batch]" in out
    assert "out  draws           int32    [images, window]" in out
    assert f"images 1/1/{manifest.limits['max_images']}" in out
    assert "(specrt-bundle v2," in out
    capacity = manifest.models["target"]["capacity"]
    assert f"cache_len {capacity}/{capacity}/{capacity}" in out
    assert "lint (TensorRT 10.3, opset <= 20): 0 error(s), 0 warning(s)" in out


def test_inspect_of_a_tampered_bundle_exits_2(bundle, tmp_path, capsys):
    manifest, _ = bundle
    copy = tmp_path / "copy"
    shutil.copytree(manifest.root, copy)
    (copy / "neighbours.npy").write_bytes(b"not the table")
    assert _exit_code(["inspect", str(copy)]) == 2
    assert "neighbours.npy" in capsys.readouterr().err


# ---- lint on hand-made graphs ----------------------------------------------------------


def _spec(inputs, outputs, profile) -> GraphSpec:
    return GraphSpec(name="g", file="g.onnx", role="target", kind="step", opset=18,
                     inputs=tuple(inputs), outputs=tuple(outputs), profile=profile)


def _io(name: str, elem_type: int, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


def _lint(tmp_path, graph: onnx.GraphProto, spec: GraphSpec, opset: int = 18, **kwargs):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    return lint_graph(path, spec, **kwargs)


def _messages(findings, severity):
    return [f.message for f in findings if f.severity == severity]


SPEC_X = _spec([TensorSpec("x", "float32", ("batch", 4))], [TensorSpec("y", "float32", ("batch", 4))], {"batch": {"min": 1, "opt": 1, "max": 2}})


def test_clean_graph_has_no_findings(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [_io("x", TensorProto.FLOAT, ["batch", 4])], [_io("y", TensorProto.FLOAT, ["batch", 4])])
    assert _lint(tmp_path, graph, SPEC_X) == []


def test_control_flow_unsupported_and_custom_ops_are_errors(tmp_path):
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "branch", [],
                               [_io("b", TensorProto.FLOAT, ["batch", 4])])
    # The lint reads structure only, so the graph need not be runnable.
    nodes = [
        helper.make_node("If", ["x"], ["y0"], then_branch=branch, else_branch=branch),
        helper.make_node("Unique", ["x"], ["u"]),
        helper.make_node("FusedThing", ["x"], ["f"], domain="com.example"),
        helper.make_node("Relu", ["y0"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [_io("x", TensorProto.FLOAT, ["batch", 4])], [_io("y", TensorProto.FLOAT, ["batch", 4])])
    errors = _messages(_lint(tmp_path, graph, SPEC_X), ERROR)
    assert any(m.startswith("If (1 node)") and "control flow" in m for m in errors)
    assert any(m.startswith("Unique") and "not supported by TensorRT 10.3" in m for m in errors)
    assert any("FusedThing" in m and "custom domain 'com.example'" in m for m in errors)


def test_a_growth_graph_is_checked_against_its_manifest_but_not_for_tensorrt(tmp_path):
    """A draft_growth graph is never built by TensorRT (float64 scores): its ops are not TensorRT's
    concern, its I/O still has to match the manifest."""
    from dataclasses import replace

    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "g",
                              [_io("x", TensorProto.FLOAT, ["batch", 4])], [_io("y", TensorProto.DOUBLE, ["batch", 4])])
    growth = replace(SPEC_X, kind="growth", growth={"depth": 2, "top_k": 2},
                     outputs=(TensorSpec("y", "float64", ("batch", 4)),))
    assert _lint(tmp_path, graph, growth) == []
    assert _messages(_lint(tmp_path, graph, replace(growth, outputs=SPEC_X.outputs)), ERROR) == \
        ["output y is float64, manifest says float32"]
    assert any("Unique" in m for m in _messages(_lint(tmp_path, graph, replace(growth, kind="step", growth=None)), ERROR))


def test_onnxruntime_ops_are_notes_not_errors(tmp_path):
    """MatMulNBits (onnxruntime's int4) marks a graph made for onnxruntime: TensorRT cannot build it,
    but nothing is wrong with it (specrt inspect: onnxruntime-only, exit 0 unless --require-trt)."""
    nodes = [helper.make_node("MatMulNBits", ["x", "w", "s"], ["m"], domain="com.microsoft", K=4, N=4, bits=4,
                              block_size=32),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_io("x", TensorProto.FLOAT, ["batch", 4])], [_io("y", TensorProto.FLOAT, ["batch", 4])])
    findings = _lint(tmp_path, graph, SPEC_X)
    assert _messages(findings, ERROR) == [] and _messages(findings, WARNING) == []
    [note] = _messages(findings, NOTE)
    assert note.startswith("MatMulNBits (1 node) is onnxruntime's own op (com.microsoft)")
    assert "specrt quantize --backend modelopt" in note


def test_opset_above_20_and_attention_are_errors_for_tensorrt_10_3_only(tmp_path):
    nodes = [helper.make_node("Attention", ["x", "x", "x"], ["y"])]
    spec = _spec([TensorSpec("x", "float32", ("batch", 2, 3, 4))], [TensorSpec("y", "float32", ("batch", 2, 3, 4))],
                 {"batch": {"min": 1, "opt": 1, "max": 2}})
    graph = helper.make_graph(nodes, "g", [_io("x", TensorProto.FLOAT, ["batch", 2, 3, 4])],
                              [_io("y", TensorProto.FLOAT, ["batch", 2, 3, 4])])
    findings = _lint(tmp_path, graph, spec, opset=23)
    errors = _messages(findings, ERROR)
    assert any("opset 23 > 20" in m for m in errors)
    assert any(m.startswith("Attention") for m in errors)
    newer = _lint(tmp_path, graph, spec, opset=23, max_opset=23)
    assert _messages(newer, ERROR) == []
    assert any(m.startswith("Attention") for m in _messages(newer, WARNING))


def test_int64_inputs_unprofiled_dims_and_manifest_mismatches_are_errors(tmp_path):
    spec = _spec([TensorSpec("ids", "int32", ("batch", "window"))], [TensorSpec("y", "float32", ("batch", "window", 8))],
                 {"batch": {"min": 1, "opt": 1, "max": 2}, "window": {"min": 1, "opt": 2, "max": 4}})
    table = numpy_helper.from_array(np.zeros((10, 8), np.float32), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                              [_io("ids", TensorProto.INT64, ["batch", "seq"])],
                              [_io("y", TensorProto.FLOAT, ["batch", "seq", 8]), _io("extra", TensorProto.FLOAT, [None])],
                              initializer=[table])
    errors = _messages(_lint(tmp_path, graph, spec), ERROR)
    assert any("input ids is int64" in m for m in errors)
    assert any("dynamic dim 'seq' has no optimization profile" in m for m in errors)
    assert any("input ids is int64, manifest says int32" in m for m in errors)
    assert any("graph output 'extra' is not in the manifest" in m for m in errors)


def test_runtime_computed_axes_are_a_warning(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array([0], np.int64))),
             helper.make_node("Slice", ["shape", "zero", "zero_plus"], ["axes"]),
             helper.make_node("Add", ["zero", "zero"], ["zero_plus"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [_io("x", TensorProto.FLOAT, ["batch", 4])], [_io("y", TensorProto.FLOAT, ["batch", 4])])
    warnings = _messages(_lint(tmp_path, graph, SPEC_X), WARNING)
    assert any(m.startswith("ReduceSum node") and "computed at run time" in m for m in warnings)


def test_inspect_exits_1_when_the_lint_finds_errors(bundle, tmp_path, capsys):
    """A bundle whose vq_decode graph was swapped for one with an int64 input fails the lint."""
    manifest, _ = bundle
    copy = tmp_path / "copy"
    shutil.copytree(manifest.root, copy)
    model = onnx.load(str(copy / "vq_decode.onnx"))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    onnx.save(model, str(copy / "vq_decode.onnx"))
    raw = json.loads((copy / "manifest.json").read_text())
    raw["files"]["vq_decode.onnx"] = file_record(copy / "vq_decode.onnx")
    (copy / "manifest.json").write_text(json.dumps(raw))
    assert _exit_code(["inspect", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "error: vq_decode: input codes is int64" in out
    assert ": 2 error(s), 0 warning(s)" in out  # int64 where int32 is bound, and the manifest's dtype differs


def test_a_neighbour_table_listing_a_token_itself_fails_the_lint(bundle, tmp_path, capsys):
    manifest, _ = bundle
    copy = tmp_path / "copy"
    shutil.copytree(manifest.root, copy)
    table = np.load(copy / "neighbours.npy")
    table[5, 0] = 5
    np.save(copy / "neighbours.npy", table)
    raw = json.loads((copy / "manifest.json").read_text())
    raw["files"]["neighbours.npy"] = file_record(copy / "neighbours.npy")
    (copy / "manifest.json").write_text(json.dumps(raw))
    assert _exit_code(["inspect", str(copy)]) == 1
    assert "error: neighbours: some tokens are listed as their own neighbour" in capsys.readouterr().out
