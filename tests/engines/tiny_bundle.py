"""Small ONNX graphs in the contract's layout, built with onnx.helper, plus a manifest.

They stand in for an exported bundle in the engine tests: a one-layer transformer step
(int32 ids and positions, bool mask, past_kv, RMSNorm written out as Pow/ReduceMean/Add/
Sqrt/Div and once with Reciprocal, Softmax attention, a -3.4e38 mask fill) and a tiny VQ
decoder (a LayerNorm chain with Sub/Pow/Div, nearest Resize with its float32 scales, Conv).
The prefill and step graphs end in the sampling head as the exporter writes it (mix @
logits, Softmax, CumSum, LessOrEqual count, Clip, Cast to int32), so manifest version 2.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.manifest import VERSION, file_record

N_LAYER, N_HEAD, HEAD_DIM, DIM, VOCAB, NUM_CLASSES = 1, 2, 8, 16, 32, 4
CAPACITY = 12
GRID, CODE_DIM = 4, 8
OPSET = 18


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def head_inits() -> list[onnx.TensorProto]:
    return [_init("head_flat", np.array([0, -1], np.int64)), _init("head_ivw", np.array([0, -1, VOCAB], np.int64)),
            _init("head_last", np.array(-1, np.int64)), _init("head_axes", np.array([-1], np.int64)),
            _init("head_top", np.float32(VOCAB - 1))]


def head_nodes(logits: str = "logits") -> list[onnx.NodeProto]:
    """The sampling head after `logits` [batch, W, V]: (mix [I, batch], uniforms [I, W]) -> probs, draws."""
    n = helper.make_node
    return [
        n("Reshape", [logits, "head_flat"], ["head_logits_flat"]),             # [batch, W*V]
        n("MatMul", ["mix", "head_logits_flat"], ["head_guided_flat"]),        # [I, W*V]
        n("Reshape", ["head_guided_flat", "head_ivw"], ["head_guided"]),       # [I, W, V]
        n("Softmax", ["head_guided"], ["probs"], axis=-1),
        n("CumSum", ["probs", "head_last"], ["head_cdf"]),
        n("Gather", ["head_cdf", "head_last"], ["head_total"], axis=2),        # [I, W]
        n("Mul", ["uniforms", "head_total"], ["head_threshold"]),
        n("Unsqueeze", ["head_threshold", "head_axes"], ["head_threshold3"]),
        n("LessOrEqual", ["head_cdf", "head_threshold3"], ["head_below"]),
        n("Cast", ["head_below"], ["head_below_f"], to=TensorProto.FLOAT),
        n("ReduceSum", ["head_below_f", "head_axes"], ["head_count"], keepdims=0),
        n("Clip", ["head_count", "", "head_top"], ["head_clamped"]),
        n("Cast", ["head_clamped"], ["draws"], to=TensorProto.INT32),
    ]


def head_io(window) -> tuple[list, list]:
    """The head's graph inputs and outputs for a window dim (a name, or 1 for prefill)."""
    info = helper.make_tensor_value_info
    return ([info("mix", TensorProto.FLOAT, ["images", "batch"]), info("uniforms", TensorProto.FLOAT, ["images", window])],
            [info("probs", TensorProto.FLOAT, ["images", window, VOCAB]), info("draws", TensorProto.INT32, ["images", window])])


def head_reference(logits: np.ndarray, mix: np.ndarray, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The contract's head in numpy float64: softmax(mix @ logits) and #{v: cdf_v <= u·cdf_V}, clamped."""
    guided = np.einsum("ib,bwv->iwv", mix.astype(np.float64), logits.astype(np.float64))
    probs = np.exp(guided - guided.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    cdf = np.cumsum(probs, -1)
    draws = np.minimum((cdf <= (uniforms * cdf[..., -1])[..., None]).sum(-1), logits.shape[-1] - 1)
    return probs, draws


def step_graph(seed: int = 0) -> onnx.ModelProto:
    """target_step: input_ids, positions, attention_mask, past_kv, mix, uniforms -> logits, present_kv, probs, draws."""
    rng = np.random.default_rng(seed)
    w = lambda *shape, scale=0.3: (rng.standard_normal(shape) * scale).astype(np.float32)  # noqa: E731
    inits = [
        _init("emb", w(VOCAB, DIM, scale=1.0)), _init("norm1_w", 1 + w(DIM, scale=0.1)),
        _init("wq", w(DIM, DIM)), _init("wk", w(DIM, DIM)), _init("wv", w(DIM, DIM)), _init("wo", w(DIM, DIM)),
        _init("norm2_w", 1 + w(DIM, scale=0.1)), _init("wout", w(DIM, VOCAB)), _init("pos_scale", w(DIM, scale=0.01)),
        _init("two", np.float32(2.0)), _init("eps", np.float32(1e-5)),
        _init("sqrt_d", np.float32(np.sqrt(HEAD_DIM))), _init("neg_big", np.float32(-3.4e38)),
        _init("axis_last", np.array([-1], np.int64)), _init("ax0", np.array([0], np.int64)), _init("ax1", np.array([1], np.int64)),
        _init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)),
        _init("bwhd", np.array([0, 0, N_HEAD, HEAD_DIM], np.int64)), _init("bwd", np.array([0, 0, DIM], np.int64)),
        *head_inits(),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "input_ids"], ["tok"]),
        n("Cast", ["positions"], ["pos_f"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["pos_f", "axis_last"], ["pos_u"]),
        n("Mul", ["pos_u", "pos_scale"], ["pos_emb"]),
        n("Add", ["tok", "pos_emb"], ["x"]),
        # RMSNorm, Div form
        n("Pow", ["x", "two"], ["x_sq"]),
        n("ReduceMean", ["x_sq", "axis_last"], ["ms"], keepdims=1),
        n("Add", ["ms", "eps"], ["ms_eps"]),
        n("Sqrt", ["ms_eps"], ["rms"]),
        n("Div", ["x", "rms"], ["xn"]),
        n("Mul", ["xn", "norm1_w"], ["h"]),
    ]
    for name in ("q", "k", "v"):
        nodes += [n("MatMul", ["h", f"w{name}"], [f"{name}_flat"]),
                  n("Reshape", [f"{name}_flat", "bwhd"], [f"{name}_4d"]),
                  n("Transpose", [f"{name}_4d"], [name], perm=[0, 2, 1, 3])]  # [B, H, W, D]
    nodes += [
        n("Gather", ["past_kv", "i0"], ["past0"], axis=0),          # [2, B, H, C, D]
        n("Gather", ["past0", "i0"], ["past_k"], axis=0),           # [B, H, C, D]
        n("Gather", ["past0", "i1"], ["past_v"], axis=0),
        n("Concat", ["past_k", "k"], ["k_all"], axis=2),
        n("Concat", ["past_v", "v"], ["v_all"], axis=2),
        n("Transpose", ["k_all"], ["k_t"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "k_t"], ["scores"]),
        n("Div", ["scores", "sqrt_d"], ["scaled"]),
        n("Unsqueeze", ["attention_mask", "ax1"], ["mask4"]),
        n("Where", ["mask4", "scaled", "neg_big"], ["masked"]),
        n("Softmax", ["masked"], ["attn_probs"], axis=-1),
        n("MatMul", ["attn_probs", "v_all"], ["attn"]),
        n("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["attn_t", "bwd"], ["attn_flat"]),
        n("MatMul", ["attn_flat", "wo"], ["o"]),
        n("Add", ["x", "o"], ["x2"]),
        # RMSNorm, Reciprocal form
        n("Pow", ["x2", "two"], ["x2_sq"]),
        n("ReduceMean", ["x2_sq", "axis_last"], ["ms2"], keepdims=1),
        n("Add", ["ms2", "eps"], ["ms2_eps"]),
        n("Sqrt", ["ms2_eps"], ["rms2"]),
        n("Reciprocal", ["rms2"], ["inv_rms2"]),
        n("Mul", ["x2", "inv_rms2"], ["x2n"]),
        n("Mul", ["x2n", "norm2_w"], ["h2"]),
        n("MatMul", ["h2", "wout"], ["logits"]),
        n("Unsqueeze", ["k", "ax0"], ["k5"]),
        n("Unsqueeze", ["v", "ax0"], ["v5"]),
        n("Concat", ["k5", "v5"], ["kv5"], axis=0),
        n("Unsqueeze", ["kv5", "ax0"], ["present_kv"]),
        *head_nodes(),
    ]
    head_inputs, head_outputs = head_io("window")
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "window"]),
        helper.make_tensor_value_info("positions", TensorProto.INT32, ["batch", "window"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.BOOL, ["batch", "window", "total_len"]),
        helper.make_tensor_value_info("past_kv", TensorProto.FLOAT, [N_LAYER, 2, "batch", N_HEAD, "cache_len", HEAD_DIM]),
        *head_inputs,
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "window", VOCAB]),
        helper.make_tensor_value_info("present_kv", TensorProto.FLOAT, [N_LAYER, 2, "batch", N_HEAD, "window", HEAD_DIM]),
        *head_outputs,
    ]
    graph = helper.make_graph(nodes, "target_step", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def prefill_graph(seed: int = 2) -> onnx.ModelProto:
    """target_prefill: class_ids int32 [batch], mix, uniforms [images, 1] -> logits [batch, 1, vocab],
    present_kv [L, 2, batch, H, 1, D], probs [images, 1, vocab], draws [images, 1]."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)  # noqa: E731
    inits = [_init("cls_emb", w(NUM_CLASSES + 1, DIM)), _init("wk", w(DIM, DIM)), _init("wv", w(DIM, DIM)),
             _init("wout", w(DIM, VOCAB)), _init("ax0", np.array([0], np.int64)), _init("ax1", np.array([1], np.int64)),
             _init("b1hd", np.array([0, 1, N_HEAD, HEAD_DIM], np.int64)), *head_inits()]
    n = helper.make_node
    nodes = [n("Gather", ["cls_emb", "class_ids"], ["c"]), n("Unsqueeze", ["c", "ax1"], ["x"]),
             n("MatMul", ["x", "wout"], ["logits"])]
    for name in ("k", "v"):
        nodes += [n("MatMul", ["x", f"w{name}"], [f"{name}_flat"]), n("Reshape", [f"{name}_flat", "b1hd"], [f"{name}_4d"]),
                  n("Transpose", [f"{name}_4d"], [name], perm=[0, 2, 1, 3]), n("Unsqueeze", [name, "ax0"], [f"{name}5"])]
    nodes += [n("Concat", ["k5", "v5"], ["kv5"], axis=0), n("Unsqueeze", ["kv5", "ax0"], ["present_kv"]), *head_nodes()]
    head_inputs, head_outputs = head_io(1)
    graph = helper.make_graph(
        nodes, "target_prefill", [helper.make_tensor_value_info("class_ids", TensorProto.INT32, ["batch"]), *head_inputs],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, VOCAB]),
         helper.make_tensor_value_info("present_kv", TensorProto.FLOAT, [N_LAYER, 2, "batch", N_HEAD, 1, HEAD_DIM]),
         *head_outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def vq_graph(seed: int = 1) -> onnx.ModelProto:
    """vq_decode: codes int32 [batch, grid, grid] -> image [batch, 3, 2*grid, 2*grid]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("codebook", rng.standard_normal((VOCAB, CODE_DIM)).astype(np.float32)),
        _init("ax1", np.array([1], np.int64)), _init("two", np.float32(2.0)), _init("eps", np.float32(1e-6)),
        _init("scales", np.array([1, 1, 2, 2], np.float32)),
        _init("conv_w", (rng.standard_normal((3, CODE_DIM, 1, 1)) * 0.3).astype(np.float32)),
        _init("conv_b", np.zeros(3, np.float32)),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["codebook", "codes"], ["z_bhwc"]),
        n("Transpose", ["z_bhwc"], ["z"], perm=[0, 3, 1, 2]),
        # LayerNorm over channels, decomposed
        n("ReduceMean", ["z", "ax1"], ["mean"], keepdims=1),
        n("Sub", ["z", "mean"], ["centred"]),
        n("Pow", ["centred", "two"], ["sq"]),
        n("ReduceMean", ["sq", "ax1"], ["var"], keepdims=1),
        n("Add", ["var", "eps"], ["var_eps"]),
        n("Sqrt", ["var_eps"], ["std"]),
        n("Div", ["centred", "std"], ["zn"]),
        n("Resize", ["zn", "", "scales"], ["up"], mode="nearest"),
        n("Conv", ["up", "conv_w", "conv_b"], ["image"]),
    ]
    graph = helper.make_graph(
        nodes, "vq_decode",
        [helper.make_tensor_value_info("codes", TensorProto.INT32, ["batch", GRID, GRID])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 2 * GRID, 2 * GRID])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def head_entries(window) -> tuple[list[dict], list[dict]]:
    """Manifest I/O entries of the head for a window dim (a name, or 1 for prefill)."""
    return ([{"name": "mix", "dtype": "float32", "shape": ["images", "batch"]},
             {"name": "uniforms", "dtype": "float32", "shape": ["images", window]}],
            [{"name": "probs", "dtype": "float32", "shape": ["images", window, VOCAB]},
             {"name": "draws", "dtype": "int32", "shape": ["images", window]}])


IMAGES_PROFILE = {"min": 1, "opt": 1, "max": 4}


def step_entry(file: str = "target_step.onnx") -> dict:
    head_inputs, head_outputs = head_entries("window")
    return {
        "file": file, "role": "target", "kind": "step", "opset": OPSET,
        "inputs": [
            {"name": "input_ids", "dtype": "int32", "shape": ["batch", "window"]},
            {"name": "positions", "dtype": "int32", "shape": ["batch", "window"]},
            {"name": "attention_mask", "dtype": "bool", "shape": ["batch", "window", "total_len"]},
            {"name": "past_kv", "dtype": "float32", "shape": [N_LAYER, 2, "batch", N_HEAD, "cache_len", HEAD_DIM]},
            *head_inputs,
        ],
        "outputs": [
            {"name": "logits", "dtype": "float32", "shape": ["batch", "window", VOCAB]},
            {"name": "present_kv", "dtype": "float32", "shape": [N_LAYER, 2, "batch", N_HEAD, "window", HEAD_DIM]},
            *head_outputs,
        ],
        "profile": {"batch": {"min": 1, "opt": 2, "max": 4},
                    "images": dict(IMAGES_PROFILE),
                    "window": {"min": 1, "opt": 4, "max": 8},
                    "cache_len": {"min": CAPACITY, "opt": CAPACITY, "max": CAPACITY},
                    "total_len": {"min": CAPACITY + 1, "opt": CAPACITY + 4, "max": CAPACITY + 8}},
    }


def vq_entry() -> dict:
    return {
        "file": "vq_decode.onnx", "role": "vq", "kind": "decode", "opset": OPSET,
        "inputs": [{"name": "codes", "dtype": "int32", "shape": ["batch", GRID, GRID]}],
        "outputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 2 * GRID, 2 * GRID]}],
        "profile": {"batch": {"min": 1, "opt": 1, "max": 4}},
    }


def prefill_entry() -> dict:
    head_inputs, head_outputs = head_entries(1)
    return {
        "file": "target_prefill.onnx", "role": "target", "kind": "prefill", "opset": OPSET,
        "inputs": [{"name": "class_ids", "dtype": "int32", "shape": ["batch"]}, *head_inputs],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 1, VOCAB]},
                    {"name": "present_kv", "dtype": "float32", "shape": [N_LAYER, 2, "batch", N_HEAD, 1, HEAD_DIM]},
                    *head_outputs],
        "profile": {"batch": {"min": 1, "opt": 2, "max": 4}, "images": dict(IMAGES_PROFILE)},
    }


def write_bundle(root: Path, with_prefill: bool = False) -> Path:
    """A bundle of target_step and vq_decode (and target_prefill first, if asked) in `root`; returns its path."""
    root.mkdir(parents=True, exist_ok=True)
    graphs = {"target_step": (step_graph(), step_entry()), "vq_decode": (vq_graph(), vq_entry())}
    if with_prefill:
        graphs = {"target_prefill": (prefill_graph(), prefill_entry()), **graphs}
    for model, entry in graphs.values():
        onnx.save(model, root / entry["file"])
    manifest = {
        "format": "specrt-bundle", "version": VERSION, "created_by": "specrt tests",
        "models": {"target": {"vocab_size": VOCAB, "grid_size": GRID, "cond_len": 1, "num_classes": NUM_CLASSES,
                              "null_class": NUM_CLASSES, "n_layer": N_LAYER, "n_head": N_HEAD, "n_kv_head": N_HEAD,
                              "head_dim": HEAD_DIM, "dim": DIM, "capacity": CAPACITY}},
        "limits": {"max_window": 8, "max_batch": 4},
        "graphs": {name: entry for name, (_, entry) in graphs.items()},
        "files": {entry["file"]: file_record(root / entry["file"]) for _, entry in graphs.values()},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return root


def cfg_mix(images: int, scale: float = 2.0, temperature: float = 1.0) -> np.ndarray:
    """The contract's CFG mix [images, 2·images]: s/T at cond row i, (1 − s)/T at uncond row images + i."""
    eye = np.eye(images)
    return (np.concatenate([eye * scale, eye * (1.0 - scale)], axis=1) / temperature).astype(np.float32)


def step_feeds(batch: int = 2, window: int = 3, length: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    """Valid inputs for step_graph: `length` committed cache rows, a causal window after them, and
    the head's CFG mix (scale 2, one image per cond/uncond pair) with random uniforms."""
    rng = np.random.default_rng(seed)
    images = max(1, batch // 2)
    mix = cfg_mix(images) if batch == 2 * images else np.eye(batch, dtype=np.float32)
    mask = np.zeros((batch, window, CAPACITY + window), dtype=bool)
    mask[:, :, :length] = True
    mask[:, :, CAPACITY:] = np.tril(np.ones((window, window), dtype=bool))
    return {
        "input_ids": rng.integers(0, VOCAB, (batch, window)).astype(np.int32),
        "positions": (length + np.arange(window, dtype=np.int32))[None].repeat(batch, 0),
        "attention_mask": mask,
        "past_kv": rng.standard_normal((N_LAYER, 2, batch, N_HEAD, CAPACITY, HEAD_DIM)).astype(np.float32),
        "mix": mix,
        "uniforms": rng.random((mix.shape[0], window)).astype(np.float32),
    }
