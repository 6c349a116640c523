"""fp16/bf16 graph conversion: runs in onnxruntime within fp16 tolerance, norms and softmax stay fp32."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from specrt.engines.precision import (builder_flag_names, convert_float_graph, fp32_nodes, needs_conversion,
                                      write_converted)
from specrt.errors import SpecrtError
from tiny_bundle import GRID, VOCAB, head_reference, step_feeds, step_graph, vq_graph

FP16 = TensorProto.FLOAT16


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _types(model):
    """Element type of every tensor of a model, from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    types.update({i.name: i.data_type for i in inferred.graph.initializer})
    return types


def _tolerance(reference):
    # fp16 keeps 11 significant bits (relative step 2^-10 ~ 1e-3); a few roundings per layer
    # on values of magnitude ~max|ref| give a few 1e-3 relative error at most.
    return 1e-2 * max(1.0, float(np.abs(reference).max()))


def test_converted_step_graph_matches_fp32_in_onnxruntime():
    feeds = step_feeds(batch=2, window=3, length=5)
    reference = _run(step_graph(), feeds)
    converted = convert_float_graph(step_graph(), "fp16")
    onnx.checker.check_model(converted, full_check=True)
    logits, present, probs, draws = _run(converted, feeds)
    for ref, out in zip(reference, (logits, present, probs)):
        assert out.dtype == np.float32 and out.shape == ref.shape
        np.testing.assert_allclose(out, ref, rtol=0, atol=_tolerance(ref))
        assert not np.allclose(out, ref, rtol=0, atol=1e-7)  # it really ran in fp16
    # the head ran in fp32 on the fp16 logits: exactly the contract's head of those logits
    expected_probs, expected_draws = head_reference(logits, feeds["mix"], feeds["uniforms"])
    np.testing.assert_allclose(probs, expected_probs, rtol=0, atol=1e-6)
    assert draws.dtype == np.int32
    np.testing.assert_array_equal(draws, expected_draws)


def test_sampling_head_stays_fp32_whole():
    """CumSum over the vocabulary and the count of CDF entries (exact in fp16 only up to 2048) stay fp32."""
    converted = convert_float_graph(step_graph(), "fp16")
    types = _types(converted)
    for name in ("head_guided", "probs", "head_cdf", "head_total", "head_threshold", "head_count", "head_clamped"):
        assert types[name] == TensorProto.FLOAT, name
    assert types["draws"] == TensorProto.INT32 and types["head_top"] == TensorProto.FLOAT
    [matmul] = [n for n in converted.graph.node if n.output[0] == "head_guided_flat"]
    assert matmul.input[0] == "mix" and types[matmul.input[1]] == TensorProto.FLOAT  # fp16 logits cast up once


def test_converted_vq_graph_matches_fp32_in_onnxruntime():
    codes = np.random.default_rng(0).integers(0, VOCAB, (2, GRID, GRID)).astype(np.int32)
    [reference] = _run(vq_graph(), {"codes": codes})
    [out] = _run(convert_float_graph(vq_graph(), "fp16"), {"codes": codes})
    np.testing.assert_allclose(out, reference, rtol=0, atol=_tolerance(reference))


def test_norms_and_softmax_stay_fp32_and_matmuls_go_fp16():
    converted = convert_float_graph(step_graph(), "fp16")
    types = _types(converted)
    ops = {}
    for node in converted.graph.node:
        ops.setdefault(node.op_type, []).append(node)
    for op in ("Softmax", "ReduceMean", "Pow", "Sqrt", "Reciprocal"):
        for node in ops[op]:
            assert types[node.output[0]] == TensorProto.FLOAT, (op, node.output[0])
    assert types["ms_eps"] == TensorProto.FLOAT and types["xn"] == TensorProto.FLOAT  # eps Add and x / rms
    for node in ops["MatMul"]:
        assert types[node.output[0]] == (TensorProto.FLOAT if node.input[0] == "mix" else FP16)  # the head stays fp32
    assert types["wq"] == FP16 and types["emb"] == FP16
    assert types["scaled"] == FP16  # the attention scale is not part of a norm


def test_layernorm_chain_stays_fp32_and_resize_scales_stay_float32():
    converted = convert_float_graph(vq_graph(), "fp16")
    types = _types(converted)
    for name in ("mean", "centred", "sq", "var", "var_eps", "std", "zn"):
        assert types[name] == TensorProto.FLOAT, name
    assert types["scales"] == TensorProto.FLOAT and types["codebook"] == FP16 and types["conv_w"] == FP16


def test_graph_io_keeps_float32_by_default_and_can_go_fp16():
    kept = convert_float_graph(step_graph(), "fp16")
    assert {v.name: v.type.tensor_type.elem_type for v in kept.graph.output} == {
        "logits": TensorProto.FLOAT, "present_kv": TensorProto.FLOAT, "probs": TensorProto.FLOAT,
        "draws": TensorProto.INT32}
    low = convert_float_graph(step_graph(), "fp16", keep_io_types=False)
    assert {v.name: v.type.tensor_type.elem_type for v in low.graph.input}["past_kv"] == FP16
    assert {v.name: v.type.tensor_type.elem_type for v in low.graph.output}["logits"] == FP16
    feeds = step_feeds()
    for name in ("past_kv", "mix", "uniforms"):
        feeds[name] = feeds[name].astype(np.float16)
    logits = _run(low, feeds)[0]
    assert logits.dtype == np.float16
    np.testing.assert_allclose(logits.astype(np.float32), _run(step_graph(), step_feeds())[0], atol=5e-2)


def test_huge_mask_constants_are_clipped_not_infinite():
    converted = convert_float_graph(step_graph(), "fp16")
    [neg_big] = [i for i in converted.graph.initializer if i.name == "neg_big"]
    value = onnx.numpy_helper.to_array(neg_big)
    assert value.dtype == np.float16 and value == np.float16(-65504)


def test_bf16_conversion_is_a_valid_graph_with_bf16_weights():
    converted = convert_float_graph(step_graph(), "bf16")
    onnx.checker.check_model(converted, full_check=True)
    types = _types(converted)
    assert types["wq"] == TensorProto.BFLOAT16 and types["attn_probs"] == TensorProto.FLOAT
    [wq] = [i for i in converted.graph.initializer if i.name == "wq"]
    [orig] = [i for i in step_graph().graph.initializer if i.name == "wq"]
    np.testing.assert_allclose(onnx.numpy_helper.to_array(wq).astype(np.float32), onnx.numpy_helper.to_array(orig),
                               rtol=2 ** -8)


def test_fp32_region_grows_through_norm_bridges_only():
    graph = step_graph().graph
    kept = {graph.node[i].output[0] for i in fp32_nodes(graph)}
    assert {"x_sq", "ms", "ms_eps", "rms", "xn", "attn_probs", "inv_rms2"} <= kept
    assert {"head_guided_flat", "probs", "head_cdf", "head_count", "draws"} <= kept  # the head, from mix/uniforms on
    assert not {"h", "x", "x2", "x2n", "scaled", "masked", "logits", "head_logits_flat"} & kept


def test_constant_nodes_and_cast_to_float_are_converted():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", TensorProto.FLOAT, [2], [0.5, 2.0])),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "c"], ["y0"]),
        helper.make_node("Add", ["y0", "nf"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("n", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    converted = convert_float_graph(model, "fp16")
    types = _types(converted)
    assert types["c"] == FP16 and types["nf"] == FP16 and types["y"] == TensorProto.FLOAT
    [out] = _run(converted, {"x": np.array([1.0, 3.0], np.float32), "n": np.array([1, 2], np.int32)})
    np.testing.assert_allclose(out, [1.5, 8.0])


def test_subgraphs_are_refused():
    body = helper.make_graph([], "b", [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=body)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(SpecrtError, match="subgraphs"):
        convert_float_graph(helper.make_model(graph), "fp16")


@pytest.mark.parametrize("precision, version, flags, convert", [
    ("fp32", "10.3.0", [], False), ("fp16", "10.3.0", ["FP16"], False), ("bf16", "10.8.0", ["BF16"], False),
    ("fp32", "11.0.0", [], False), ("fp16", "11.0.0", [], True), ("bf16", "11.2.1", [], True),
])
def test_flags_on_tensorrt_10_conversion_on_11(precision, version, flags, convert):
    assert builder_flag_names(precision, version) == flags
    assert needs_conversion(precision, version) == convert


def test_write_converted_reuses_a_fresh_copy_and_redoes_a_stale_one(tmp_path):
    source = tmp_path / "target_step.onnx"
    onnx.save(step_graph(), source)
    out = write_converted(source, "a" * 64, "fp16", tmp_path / "converted")
    assert out.name == "target_step.fp16.onnx"
    mtime = out.stat().st_mtime_ns
    assert write_converted(source, "a" * 64, "fp16", tmp_path / "converted").stat().st_mtime_ns == mtime
    out.write_bytes(b"")  # the stamp still matches: a copy is reused on the stamp, as documented
    write_converted(source, "b" * 64, "fp16", tmp_path / "converted")
    onnx.checker.check_model(onnx.load(out))


def test_exported_graph_keeps_only_head_norms_and_softmax_fp32(demo_bundle):
    """The exporter reads the `images` dim as Shape(mix) at the top of the graph; the head's
    fp32 region must follow mix's values, not its shape, or the whole transformer stays fp32."""
    graph = onnx.load(str(demo_bundle / "target_step.onnx")).graph
    weights = {init.name for init in graph.initializer}
    kept = fp32_nodes(graph)
    linear = [i for i, node in enumerate(graph.node) if node.op_type == "MatMul" and node.input[1] in weights]
    assert len(linear) == 5 * 4 + 1  # wqkv, wo, w1, w2, w3 per layer and the output head of the demo target
    assert not kept & set(linear)
    kept_ops = {graph.node[i].op_type for i in kept}
    assert {"Softmax", "ReduceMean", "CumSum"} <= kept_ops and "Shape" not in kept_ops
