"""The engine-side checks on a graph from the real exporter (torch): profile validation and fp16 conversion."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from specrt.engines.precision import convert_float_graph, fp32_nodes  # noqa: E402
from specrt.engines.profiles import derive_profile, onnx_input_dims, validate_against_onnx  # noqa: E402


@pytest.fixture(scope="module")
def exported_step(tmp_path_factory):
    from specrt.export.onnx_export import GraphLimits, export_step
    from specrt.models.llamagen_gpt import GPT, GPTConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gpt = GPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=64, num_classes=4, grid_size=4, multiple_of=32)).eval()
    capacity = 1 + 16 + 8
    limits = GraphLimits(capacity=capacity, max_window=8, opt_window=4, max_batch=4, opt_batch=2)
    out = tmp_path_factory.mktemp("export")
    spec = export_step(gpt, "draft", limits, out)
    return spec, out / spec.file


def _feeds(spec, rng):
    feeds = {}
    for tensor in spec.inputs:
        shape = spec.shape_at(tensor, "opt")
        if tensor.name == "attention_mask":
            batch, window, total = shape
            mask = np.zeros(shape, dtype=bool)
            mask[:, :, :5] = True
            mask[:, :, total - window:] = np.tril(np.ones((window, window), dtype=bool))
            feeds[tensor.name] = mask
        elif tensor.name == "positions":
            feeds[tensor.name] = (5 + np.arange(shape[1], dtype=np.int32))[None].repeat(shape[0], 0)
        elif tensor.dtype == "int32":
            feeds[tensor.name] = rng.integers(0, 64, shape).astype(np.int32)
        elif tensor.name == "uniforms":
            feeds[tensor.name] = rng.random(shape).astype(np.float32)
        else:
            feeds[tensor.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_exported_step_graph_passes_profile_validation(exported_step):
    spec, path = exported_step
    entry = spec.to_json()
    validate_against_onnx(derive_profile(spec.name, entry), entry, onnx_input_dims(path))


def test_exported_step_graph_converts_to_fp16_within_tolerance(exported_step):
    spec, path = exported_step
    model = onnx.load(path)
    kept = fp32_nodes(model.graph)
    kept_ops = {model.graph.node[i].op_type for i in kept}
    assert {"Softmax", "ReduceMean", "Pow", "Sqrt"} <= kept_ops  # the RMSNorm chain and attention softmax
    assert {"CumSum", "LessOrEqual", "ReduceSum"} <= kept_ops  # the sampling head
    head = [i for i, node in enumerate(model.graph.node) if node.op_type in ("CumSum", "ReduceSum", "LessOrEqual")]
    assert set(head) <= kept
    feeds = _feeds(spec, np.random.default_rng(0))
    run = lambda m: dict(zip(spec.output_names, ort.InferenceSession(  # noqa: E731
        m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)))
    reference, converted = run(model), run(convert_float_graph(onnx.load(path), "fp16"))
    for name in ("logits", "present_kv", "probs"):
        ref, out = reference[name], converted[name]
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-2 * max(1.0, np.abs(ref).max()))
    # fp16 logits may move a draw across a CDF boundary; the draws must still be those of the
    # converted graph's own (fp32) probabilities
    draws = converted["draws"]
    assert draws.dtype == np.int32
    cdf = np.cumsum(converted["probs"].astype(np.float64), -1)
    expected = np.minimum((cdf <= (feeds["uniforms"] * cdf[..., -1])[..., None]).sum(-1), cdf.shape[-1] - 1)
    np.testing.assert_array_equal(draws, expected)
