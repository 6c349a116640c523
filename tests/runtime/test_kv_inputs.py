"""Step graphs with per-layer KV inputs (`specrt export --kv-inputs layers`) against the stacked past_kv.

One tiny LlamaGen family (two layers, grouped-query attention in the target) is exported with
per-layer inputs and its step graphs again stacked, and the target of each bundle is quantized to
int8 (onnxruntime MatMulNBits). The per-layer graphs must decode the same tokens as the stacked
ones (ar, sd with the draft's step graph, sjd; CFG pairs, several images, images that finish on
different rounds leave the batch), and onnxruntime must read their cache inputs only in matrix
products: the copies the stacked graph makes of the cache (Split, Concat, Transpose) are what the
form exists to remove, and the stacked graph is the control the structural check must catch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli_helpers import one_line, run
from specrt.errors import SpecrtError
from specrt.manifest import read_manifest
from specrt.runtime.kv_inputs import layer_names, past_feeds, past_names, stacked_feed, takes_layers
from specrt.runtime.pipeline import Pipeline

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.slow  # one tiny export and two int8 quantizations: about 35 s of CPU

SAMPLING = dict(cfg_scale=3.0, temperature=1.0)
READS = {"MatMul", "FusedMatMul", "Shape"}  # what may touch a cache input in onnxruntime's optimised graph


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """The family exported with per-layer inputs, its stacked twin (the same bundle with the two step
    graphs exported stacked: every other graph is the same file) and an int8 target of each."""
    from specrt.engines.quantize import QuantizeOptions, quantize_bundle
    from specrt.export.bundle import ExportOptions, ModelSet, write_bundle
    from specrt.models.llamagen_gpt import GPT, GPTConfig
    from specrt.models.llamagen_vq import VQConfig, VQModel

    torch.manual_seed(0)
    family = dict(vocab_size=16, num_classes=4, grid_size=3, multiple_of=16, initializer_range=0.3)
    target = GPT(GPTConfig(dim=32, n_layer=2, n_head=4, n_kv_head=2, **family)).eval()
    draft = GPT(GPTConfig(dim=16, n_layer=1, n_head=2, **family)).eval()
    vq = VQModel(VQConfig(codebook_size=16, codebook_embed_dim=4, ch=8, ch_mult=(1, 2), z_channels=8,
                          num_res_blocks=1, norm_groups=4, codebook_show_usage=False)).eval()
    root = tmp_path_factory.mktemp("kv-inputs")
    options = ExportOptions(max_window=6, max_batch=3, neighbours_k=2, draft_chain=0, draft_tree="", draft_growth="",
                            kv_inputs="layers")
    models = ModelSet(target, draft, vq)
    write_bundle(models, root / "layers", options)
    _stacked_twin(root / "layers", root / "stacked", {"target": target, "draft": draft})
    out = {"models": models}
    for form in ("stacked", "layers"):
        out[form], out[f"{form}-int8"] = root / form, root / f"{form}-int8"
        quantize_bundle(out[form], out[f"{form}-int8"], QuantizeOptions(mode="int8", tool="onnxruntime"),
                        graphs=["target"])
    return out


def _stacked_twin(bundle: Path, twin: Path, models: dict) -> None:
    """A copy of `bundle` whose step graphs are exported with the stacked past_kv (what `specrt export
    --kv-inputs stacked` writes), its manifest's graph entries and file hashes updated."""
    import json
    import shutil

    from specrt.export.onnx_export import GraphLimits, export_step
    from specrt.manifest import MANIFEST_NAME, file_record

    shutil.copytree(bundle, twin)
    manifest = read_manifest(twin)
    raw = json.loads((twin / MANIFEST_NAME).read_text())
    for role, model in models.items():
        old = manifest.graph(f"{role}_step")
        limits = GraphLimits(capacity=int(manifest.models[role]["capacity"]), max_window=int(manifest.limits["max_window"]),
                             max_batch=int(manifest.limits["max_batch"]), max_images=int(manifest.limits["max_images"]))
        spec = export_step(model, role, limits, twin, old.opset, "hidden" in old.output_names, "stacked")
        raw["graphs"][spec.name] = spec.to_json()
        raw["files"][spec.file] = file_record(twin / spec.file)
    (twin / MANIFEST_NAME).write_text(json.dumps(raw, indent=2) + "\n")


def test_the_manifest_records_the_form(bundles):
    """The layered bundle's step graphs list past_key_<i>, past_value_<i> where past_kv stood; every
    graph of the stacked bundle keeps past_kv; quantizing keeps the form."""
    for name in ("layers", "layers-int8"):
        graphs = read_manifest(bundles[name]).graphs
        assert past_names(graphs["target_step"]) == layer_names(2)
        assert past_names(graphs["draft_step"]) == layer_names(1)
        assert graphs["target_step"].input("past_key_1").shape == ("batch", 2, "cache_len", 8)
    for name in ("stacked", "stacked-int8"):
        assert not any(takes_layers(g) for g in read_manifest(bundles[name]).graphs.values())
    assert "MatMulNBits" in {n.op_type for n in onnx.load(str(bundles["layers-int8"] / "target_step.onnx")).graph.node}


@pytest.mark.parametrize("precision", ["", "-int8"])
@pytest.mark.parametrize("method, params", [("ar", {}), ("sd", {"draft_len": 3}), ("sjd", {"window": 4})])
def test_per_layer_inputs_decode_the_stacked_graphs_tokens(bundles, precision, method, params):
    """Same seeds, same tokens: three images decoded together (CFG pairs; under sd and sjd they finish
    on different rounds and leave the batch), and one alone, whose tokens are the batch's first."""
    runs = {}
    for form in ("stacked", "layers"):
        pipe = Pipeline.from_bundle(bundles[form + precision], threads=1)
        batch = pipe.generate([0, 3, 1], method=method, seed=5, decode=False, **SAMPLING, **params)
        alone = pipe.generate([0], method=method, seed=5, decode=False, **SAMPLING, **params)
        runs[form] = (np.asarray(batch.tokens), np.asarray(alone.tokens))
    np.testing.assert_array_equal(runs["layers"][0], runs["stacked"][0])
    np.testing.assert_array_equal(runs["layers"][1], runs["stacked"][1])
    np.testing.assert_array_equal(runs["layers"][1][0], runs["layers"][0][0])


def _cache_readers(path: Path, tmp_path: Path) -> dict[str, set[str]]:
    """For each cache input of the graph at `path`: the op types onnxruntime's optimised CPU graph
    runs on it (through Transpose nodes that only feed a matrix product: those fuse away)."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"optimised-{path.parent.name}.onnx")
    ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath).graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    readers = {}
    for tensor in graph.input:
        if tensor.name == "past_kv" or tensor.name.startswith("past_"):
            readers[tensor.name] = {node.op_type for node in consumers.get(tensor.name, [])}
    return readers


def test_onnxruntime_reads_per_layer_caches_only_in_matrix_products(bundles, tmp_path):
    layered = _cache_readers(bundles["layers-int8"] / "target_step.onnx", tmp_path)
    assert set(layered) == set(layer_names(2))
    for name, ops in layered.items():
        assert ops and ops <= READS, f"{name} is read by {ops}"
    stacked = _cache_readers(bundles["stacked-int8"] / "target_step.onnx", tmp_path)  # the control
    assert not stacked["past_kv"] <= READS, stacked


def test_past_feeds_are_views_of_the_stacked_cache():
    spec = read_manifest_like(layer_names(2))
    kv = np.arange(2 * 2 * 3 * 2 * 5 * 4, dtype=np.float32).reshape(2, 2, 3, 2, 5, 4)
    feeds = past_feeds(spec, kv)
    assert list(feeds) == list(layer_names(2))
    assert all(np.shares_memory(value, kv) and value.flags.c_contiguous for value in feeds.values())
    np.testing.assert_array_equal(feeds["past_value_1"], kv[1, 1])
    np.testing.assert_array_equal(stacked_feed(feeds), kv)
    assert past_feeds(read_manifest_like(("past_kv",)), kv) == {"past_kv": kv}


def test_tensorrt_refuses_per_layer_inputs_in_one_line(bundles):
    from specrt.engines.build import refuse_layer_inputs

    names = list(read_manifest(bundles["layers"]).graph("target_step").input_names)
    with pytest.raises(SpecrtError, match="--kv-inputs stacked"):
        refuse_layer_inputs("target_step", names)
    refuse_layer_inputs("target_step", list(read_manifest(bundles["stacked"]).graph("target_step").input_names))


def read_manifest_like(cache_inputs):
    """A GraphSpec-shaped stand-in with these cache inputs after the step graph's first three."""
    from specrt.manifest import GraphSpec, TensorSpec

    names = ("input_ids", "positions", "attention_mask", *cache_inputs, "mix", "uniforms")
    return GraphSpec(name="target_step", file="target_step.onnx", role="target", kind="step", opset=18,
                     inputs=tuple(TensorSpec(n, "float32", ("batch",)) for n in names), outputs=(), profile={})


def test_kv_inputs_the_export_cannot_write_is_one_line(tmp_path, capsys):
    from specrt.export.bundle import ExportOptions

    code, err = run(["export", "--demo", "mar", "--kv-inputs", "layers", "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "--kv-inputs applies to LlamaGen-family bundles" in one_line(err)
    assert not (tmp_path / "b").exists()
    with pytest.raises(SpecrtError, match="--kv-inputs must be one of auto, layers, stacked"):
        ExportOptions(kv_inputs="rows")
    assert ExportOptions(kv_inputs="stacked").step_kv_inputs == "stacked"


def test_export_verify_runs_the_per_layer_graphs_against_pytorch(bundles):
    """`export --verify` feeds a per-layer step graph the views of its stacked reference cache."""
    from specrt.export.verify import verify_bundle

    report = verify_bundle(bundles["layers"], bundles["models"], threads=1)
    steps = [c for c in report.comparisons if c.graph.endswith("_step")]
    assert steps and report.passed, report.worst()
