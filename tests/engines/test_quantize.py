"""`specrt quantize` on the demo bundle: int4 (onnxruntime MatMulNBits), a quantized self-draft,
ModelOpt's int8 / fp8 QDQ graphs (skipped, saying why, without the `quant` extra), bad input.

What must hold for every quantized bundle: the chosen graphs are quantized and the others are
byte-identical copies; the sampling head stays float (no quantized node downstream of `mix` /
`uniforms`); the manifest records precision, tool, version and calibration size; every method
runs; a failure leaves nothing behind.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from specrt.cli import main
from specrt.engines.precision import downstream_nodes
from specrt.engines.quantize import QuantizeOptions, quantize_bundle
from specrt.lazy import available
from specrt.manifest import read_manifest
from specrt.runtime.pipeline import Pipeline

QUANTIZED_OPS = {"MatMulNBits", "QuantizeLinear", "DequantizeLinear"}
METHODS = ("ar", "sd", "cool-sd", "lantern", "sjd", "sjd-pac")
needs_modelopt = pytest.mark.skipif(not available("modelopt.onnx.quantization"),
                                    reason="needs NVIDIA Model Optimizer: pip install 'specrt[quant]'")


def run_cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def float_linear_layers(path: Path) -> int:
    """MatMul / Gemm nodes whose weight is a stored float tensor (or a Transpose of one): the
    linear layers a quantizer left in float."""
    graph = onnx.load(str(path)).graph
    stored = {t.name for t in graph.initializer}
    made_by = {out: node for node in graph.node for out in node.output}

    def weight(name: str) -> bool:
        node = made_by.get(name)
        return name in stored or (node is not None and node.op_type == "Transpose" and node.input[0] in stored)
    return sum(1 for n in graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and weight(n.input[1]))


def head_ops(path: Path) -> set[str]:
    """Op types of the sampling head's nodes (downstream of mix / uniforms)."""
    graph = onnx.load(str(path)).graph
    return {graph.node[i].op_type for i in downstream_nodes(graph, {"mix", "uniforms"})}


@pytest.fixture(scope="module")
def int4_bundle(demo_bundle: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q") / "int4"
    assert run_cli(["quantize", str(demo_bundle), "--mode", "int4", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture(scope="module")
def self_draft_bundle(demo_bundle: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q") / "self-int4"
    assert run_cli(["quantize", str(demo_bundle), "--self-draft", "int4", "--out", str(out), "--no-progress"]) == 0
    return out


def test_int4_quantizes_the_model_weights_and_keeps_the_head_float(demo_bundle, int4_bundle):
    manifest = read_manifest(int4_bundle)
    for name in ("target_prefill", "target_step", "draft_prefill", "draft_step"):
        record = manifest.graph(name).quantization
        assert record["precision"] == "int4" and record["tool"] == "onnxruntime"
        assert record["tool_version"] and record["block_size"] == 32 and record["accuracy_level"] == 4
        assert record["calibration_feeds"] == 0  # weight-only round-to-nearest reads no feeds
        path = manifest.graph_path(name)
        # every linear layer (wqkv, wo, w1, w2, w3 per layer, the output head) became MatMulNBits
        n_layer = manifest.models[name.split("_")[0]]["n_layer"]
        assert ops(path).count("MatMulNBits") == 5 * n_layer + 1
        assert not head_ops(path) & QUANTIZED_OPS
        assert {"Softmax", "CumSum"} <= head_ops(path)
        # fp32 -> 4 bits + a scale per 32 weights; embeddings (Gather) and norms stay fp32
        assert path.stat().st_size < 0.6 * (demo_bundle / f"{name}.onnx").stat().st_size
        # the I/O contract is unchanged
        assert manifest.graph(name).inputs == read_manifest(demo_bundle).graph(name).inputs
    # the graph that was not chosen is a byte-identical copy
    assert manifest.files["vq_decode.onnx"] == read_manifest(demo_bundle).files["vq_decode.onnx"]
    assert manifest.graph("vq_decode").quantization is None
    assert manifest.raw["quantized_from"] == str(read_manifest(demo_bundle).root)


def test_int4_target_stays_close_to_fp32(demo_bundle, int4_bundle):
    """Greedy AR tokens of the int4 target mostly agree with fp32 (a broken quantizer: ~1/512)."""
    kwargs = dict(method="ar", seed=0, temperature=0.0)
    fp32 = Pipeline.from_bundle(demo_bundle, threads=1).generate(list(range(4)), **kwargs).tokens
    int4 = Pipeline.from_bundle(int4_bundle, threads=1).generate(list(range(4)), **kwargs).tokens
    assert (fp32 == int4).mean() > 0.5


@pytest.mark.parametrize("method", METHODS)
def test_every_method_generates_from_the_int4_bundle(int4_bundle, tmp_path, method):
    out = tmp_path / "img.png"
    assert run_cli(["generate", str(int4_bundle), "--method", method, "--class", "3", "--out", str(out)]) == 0
    assert out.is_file()


def test_self_draft_is_the_quantized_target_and_accepts_more(demo_bundle, self_draft_bundle):
    source, manifest = read_manifest(demo_bundle), read_manifest(self_draft_bundle)
    assert manifest.models["draft"]["kind"] == "self"
    assert manifest.models["draft"]["n_layer"] == source.models["target"]["n_layer"]
    for kind in ("prefill", "step"):
        assert manifest.files[f"target_{kind}.onnx"] == source.files[f"target_{kind}.onnx"]  # target untouched
        draft = manifest.graph(f"draft_{kind}")
        assert draft.role == "draft" and draft.quantization["precision"] == "int4"
        assert draft.output_names == source.graph(f"target_{kind}").output_names
        assert "MatMulNBits" in ops(manifest.graph_path(f"draft_{kind}"))
    images = list(range(10))
    independent = Pipeline.from_bundle(demo_bundle, threads=1).generate(images, method="sd", seed=0)
    own = Pipeline.from_bundle(self_draft_bundle, threads=1).generate(images, method="sd", seed=0)
    # the independent demo draft accepts ~2.2 tokens per target forward at draft_len 4; the
    # target's own int4 copy agrees with it far more often (~4.2 of at most 5)
    assert own.stats.summary()["mean_accepted_length"] > independent.stats.summary()["mean_accepted_length"] + 1.0


@pytest.mark.parametrize("method", ("sd", "cool-sd", "lantern"))
def test_drafted_methods_run_with_the_self_draft(self_draft_bundle, tmp_path, method):
    assert run_cli(["generate", str(self_draft_bundle), "--method", method, "--out", str(tmp_path / "a.png")]) == 0


def test_inspect_shows_each_graphs_precision(self_draft_bundle, capsys):
    run_cli(["inspect", str(self_draft_bundle), "--no-lint"])
    out = capsys.readouterr().out
    assert "(self)" in out
    assert out.count("precision  int4 by onnxruntime") == 2  # draft_prefill, draft_step


@pytest.mark.parametrize("argv,message", [
    (["--mode", "int3"], "unknown quantization mode 'int3'"),
    (["--mode", "int4", "--graphs", "target,decoder"], "no graph or role 'decoder'"),
    (["--mode", "fp8", "--backend", "onnxruntime"], "fp8 needs --backend modelopt"),
    (["--mode", "int8", "--backend", "tensorrt"], "Invalid value for '--backend'"),
    (["--self-draft", "fp8"], "--self-draft must be int4 or int8"),
    (["--mode", "int4", "--self-draft", "int4"], "exactly one of"),
    (["--mode", "int4", "--block-size", "24"], "--block-size must be a power of two"),
    (["--mode", "int8", "--calibration-size", "0"], "--calibration-size must be an integer"),
    (["--mode", "int4", "--accuracy-level", "5"], "--accuracy-level must be an integer in [0, 4]"),
])
def test_bad_input_is_one_line_and_exit_2(demo_bundle, tmp_path, capsys, argv, message):
    out = tmp_path / "q"
    assert run_cli(["quantize", str(demo_bundle), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_inspect_reports_an_int4_bundle_as_onnxruntime_only(int4_bundle, capsys):
    """MatMulNBits is not TensorRT's, yet the bundle works: notes and exit 0; --require-trt: exit 1."""
    assert run_cli(["inspect", str(int4_bundle)]) == 0
    out = capsys.readouterr().out
    assert "0 error(s), 0 warning(s), 6 note(s)" in out  # one per int4 graph TensorRT would build (draft_growth: never)
    assert "runs on: onnxruntime only (ort, ort-cuda); TensorRT 10.3 cannot build target_prefill, target_step" in out
    assert run_cli(["inspect", str(int4_bundle), "--require-trt"]) == 1


def test_an_already_quantized_bundle_is_refused(int4_bundle, tmp_path, capsys):
    assert run_cli(["quantize", str(int4_bundle), "--mode", "int4", "--out", str(tmp_path / "again")]) == 2
    assert "already quantized" in capsys.readouterr().err


def test_missing_modelopt_is_one_line(demo_bundle, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "modelopt.onnx.quantization", None)  # import fails as if not installed
    assert run_cli(["quantize", str(demo_bundle), "--mode", "int8", "--backend", "modelopt",
                    "--out", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'specrt[quant]'" in err and len(err.splitlines()) == 1


def test_a_failure_leaves_no_bundle_and_no_partial_directory(demo_bundle, tmp_path, monkeypatch):
    import specrt.engines.quantize as quantize

    calls = []

    def fail_second(model, options, feeds=(), scratch=None):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, options, feeds, scratch)

    real = quantize.quantize_model
    monkeypatch.setattr(quantize, "quantize_model", fail_second)
    with pytest.raises(KeyboardInterrupt):
        quantize_bundle(demo_bundle, tmp_path / "q", QuantizeOptions(mode="int4"))
    assert list(tmp_path.iterdir()) == []


@needs_modelopt
@pytest.mark.parametrize("mode", ["int8", "fp8"])
def test_modelopt_qdq_graphs_calibrated_on_recorded_feeds(demo_bundle, tmp_path, mode):
    out = tmp_path / mode
    manifest = quantize_bundle(demo_bundle, out, QuantizeOptions(mode=mode, tool="modelopt", calibration_images=2,
                                                                  calibration_size=6), graphs=["target"])
    for name in ("target_prefill", "target_step"):
        record = manifest.graph(name).quantization
        assert record["tool"] == "modelopt" and record["precision"] == mode
        assert 1 <= record["calibration_feeds"] <= 6
        path = manifest.graph_path(name)
        assert "QuantizeLinear" in ops(path) and "DequantizeLinear" in ops(path)
        assert not head_ops(path) & QUANTIZED_OPS
    assert manifest.graph("target_step").quantization["calibration_feeds"] == 6  # AR + SD steps: plenty
    assert manifest.graph("draft_step").quantization is None
    result = Pipeline.from_bundle(out, threads=1).generate([1, 2], method="sd", seed=0)
    assert result.images.shape[0] == 2


@pytest.mark.parametrize("mode,backend", [pytest.param("int8", "modelopt", marks=needs_modelopt),
                                          ("int8", "onnxruntime"), ("int4", "onnxruntime")])
def test_every_graph_of_both_roles_quantizes_and_runs(demo_bundle, tmp_path, mode, backend):
    """The CLI's default --graphs target,draft quantizes every linear layer of every graph of
    both roles: the draft chain, the static tree and the growth graph too, whose later passes
    run on the head's draws and whose weights are shared between passes (and the growth graph
    takes no `uniforms`, so its calibration feeds must not carry one); every tree runs on it."""
    out = tmp_path / mode
    assert run_cli(["quantize", str(demo_bundle), "--mode", mode, "--backend", backend, "--out", str(out),
                    "--no-progress", "--calibration-images", "2", "--calibration-size", "3"]) == 0
    manifest = read_manifest(out)
    roles = [name for name, spec in read_manifest(demo_bundle).graphs.items() if spec.role in ("target", "draft")]
    assert "draft_growth" in roles and "draft_tree" in roles and "draft_chain" in roles
    for name in roles:
        record = manifest.graph(name).quantization
        assert record is not None and record["precision"] == mode and record["tool"] == backend, name
        # every linear layer of every pass, not only the first pass of a fused chain or tree
        assert float_linear_layers(demo_bundle / f"{name}.onnx") > 0, name
        assert float_linear_layers(manifest.graph_path(name)) == 0, name
    pipe = Pipeline.from_bundle(out, threads=1)
    for params in ({"tree": "dynamic"}, {"tree": "static"}, {}):
        assert pipe.generate([1], method="sd", seed=0, **params).images.shape[0] == 1


def test_growth_feeds_carry_only_the_growth_graphs_inputs(demo_bundle):
    from specrt.engines.calibration import record_feeds

    manifest = read_manifest(demo_bundle)
    feeds = record_feeds(manifest, size=2, images=1)
    for name in ("draft_chain", "draft_tree", "draft_growth"):
        assert feeds[name] and all(set(feed) == set(manifest.graph(name).input_names) for feed in feeds[name]), name


def test_calibration_feeds_are_real_decoding_inputs(demo_bundle):
    from specrt.engines.calibration import record_feeds
    from specrt.runtime.kv_inputs import stacked_feed

    feeds = record_feeds(read_manifest(demo_bundle), size=5, images=2)
    assert len(feeds["target_step"]) == len(feeds["draft_step"]) == 5
    assert len(feeds["target_prefill"]) == 2 and len(feeds["draft_prefill"]) == 1  # one prefill per image and model
    steps = feeds["target_step"]
    for feed in steps:
        batch, window = feed["input_ids"].shape
        assert batch == 2 and window in (1, 5)  # CFG pair; AR steps and SD windows of draft_len + 1
        length = int(feed["positions"][0, 0])
        assert feed["attention_mask"][0, 0, :length].all() and not feed["attention_mask"][0, 0, length:-window].any()
        assert np.abs(stacked_feed(feed)[..., :length, :]).sum() > 0  # a real prefix's KV, not zeros
    assert {f["input_ids"].shape[1] for f in feeds["draft_step"]} == {1}
