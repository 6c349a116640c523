"""fp16 / bf16 engines on both TensorRT majors.

TensorRT 10 lowers precision from a builder flag (BuilderFlag.FP16 / BF16) and keeps the
graph fp32. TensorRT 11 is strongly typed and has no such flag: an engine's types are the
ONNX graph's own types, so the graph is converted first, here, with onnx alone.

What the converter does (`convert_float_graph`):
- float32 weights, Constant values and intermediate tensors become fp16 (or bf16);
- numerically sensitive ops stay fp32: Softmax/LogSoftmax, explicit norm ops, and the
  decomposed RMSNorm/LayerNorm/GroupNorm chains (ReduceMean, Pow, Sqrt, Reciprocal, the
  Div by the root, and the Add/Sub/Mul in between whose inputs come from that chain), with
  Cast nodes inserted only where a tensor crosses between the two regions;
- the sampling head (every node downstream of the graph inputs `mix` / `uniforms`) stays
  fp32 as a whole: its CumSum runs over up to 16384 probabilities and its ReduceSum counts
  up to the vocabulary size, and fp16 holds integers exactly only up to 2048;
- graph inputs and outputs keep their fp32 types by default (`keep_io_types=True`) so the
  runtime's buffers and the contract (past_kv / logits f32) do not change; the casts at the
  boundary cost one pass over each I/O tensor per step. Pass False for fp16 I/O;
- inputs that ONNX requires to be float32 whatever the data type (Resize roi/scales,
  Upsample scales) are left fp32; fp16 constants are clipped to ±65504 so a -1e30 mask
  value becomes a large finite negative, not -inf - -inf = NaN.

Why not ModelOpt's AutoCast (`modelopt.onnx.autocast.convert_to_mixed_precision`), compared on
the demo's target_step with real recorded feeds (ModelOpt 0.47): with its defaults it keeps in
fp32 only what a reference run on random inputs flags (|x| > data_max), which on that graph was
one Where node, so the sampling head's CumSum and CDF count went fp16. Given our head's node
names and the norm/softmax op types it matches our probs (max |diff| 2e-3, same as ours), but it
still has no notion of a norm *chain*: the RMSNorm `mean(x²) + eps` Add between ReduceMean and
Sqrt (9 on that graph) goes fp16, where a mean of squares above 65504 overflows to inf. It also
raises the opset to 22 for bf16 (TensorRT 10.3 parses <= 20) and needs the `quant` extra. So the
guarantee it lacks is the whole normalisation chain in fp32; we keep this converter.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from specrt.errors import SpecrtError
from specrt.lazy import require
from specrt.manifest import HEAD_INPUTS

PRECISIONS = ("fp32", "fp16", "bf16")
CONVERTER_VERSION = "specrt-precision-3"  # part of engine cache keys: bump when the output changes

# Ops that always compute in fp32: softmax and every piece of a normalisation.
FP32_OPS = frozenset({
    "Softmax", "LogSoftmax", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp",
    "Pow", "Sqrt", "Reciprocal", "LayerNormalization", "GroupNormalization",
    "InstanceNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
})
# Elementwise ops that join the fp32 region when they sit inside a norm chain (eps Add, x - mean, ...).
BRIDGE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Max", "Min", "Clip", "Abs"})
# (op, input index) that ONNX types as float32 regardless of the data's type.
FP32_ONLY_INPUTS = frozenset({("Resize", 1), ("Resize", 2), ("Upsample", 1)})
# Ops whose output type comes from an attribute, not from their inputs: outputs stay as typed.
ATTR_TYPED_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                            "EyeLike", "Multinomial", "Bernoulli"})
CONSTANT_OPS = frozenset({"Constant", "ConstantOfShape"})
SHAPE_OPS = frozenset({"Shape", "Size"})  # read a tensor's dims only
# Graph inputs whose every downstream node computes in fp32: the sampling head's (specrt.manifest).
FP32_FROM_INPUTS = tuple(HEAD_INPUTS)
FP16_MAX = 65504.0


def validate_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise SpecrtError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def trt_major(trt_version: str) -> int:
    """Major version from a TensorRT version string ('10.3.0.30' -> 10)."""
    return int(str(trt_version).split(".")[0])


def is_strongly_typed(trt_version: str) -> bool:
    """TensorRT 11 and later take types from the network only (no FP16/BF16 builder flags)."""
    return trt_major(trt_version) >= 11


def needs_conversion(precision: str, trt_version: str) -> bool:
    """True when the ONNX graph itself must be converted for this precision and TensorRT."""
    return precision != "fp32" and is_strongly_typed(trt_version)


def builder_flag_names(precision: str, trt_version: str) -> list[str]:
    """Names of the BuilderFlag members to set: ['FP16'] / ['BF16'] on TensorRT 10, none on 11."""
    validate_precision(precision)
    if precision == "fp32" or is_strongly_typed(trt_version):
        return []
    return [precision.upper()]


def _onnx_types(onnx: Any, precision: str) -> tuple[int, int]:
    low = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[precision]
    return onnx.TensorProto.FLOAT, low


def downstream_nodes(graph: Any, sources: set[str]) -> set[int]:
    """Indices of the nodes that (transitively) consume the values of any tensor in `sources`.

    Shape and Size read only a tensor's dims, not its values, so the walk stops there: the
    exporter takes the `images` dim from Shape(mix) at the top of the graph, and following it
    would sweep the whole transformer into the sampling head.
    """
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers[name].append(i)
    found: set[int] = set()
    pending = list(sources)
    while pending:
        for i in consumers.get(pending.pop(), ()):
            if i not in found and graph.node[i].op_type not in SHAPE_OPS:
                found.add(i)
                pending.extend(out for out in graph.node[i].output if out)
    return found


def fp32_nodes(graph: Any) -> set[int]:
    """Indices of the nodes kept in fp32: FP32_OPS, the sampling head, and the norm-chain
    bridges around them.

    A bridge op joins when it divides by an fp32 value (x / rms) or when it takes an fp32
    value and feeds only fp32 nodes (ms + eps before Sqrt; x - mean before Pow and Div).
    Grown to a fixed point, so chains of any length are covered.
    """
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers[name].append(i)
    graph_outputs = {o.name for o in graph.output}
    keep = {i for i, node in enumerate(graph.node) if node.op_type in FP32_OPS}
    keep |= downstream_nodes(graph, {i.name for i in graph.input if i.name in FP32_FROM_INPUTS})
    changed = True
    while changed:
        changed = False
        for i, node in enumerate(graph.node):
            if i in keep or node.op_type not in BRIDGE_OPS:
                continue
            from_fp32 = [producer.get(name) in keep for name in node.input]
            divides_by_fp32 = node.op_type == "Div" and len(from_fp32) > 1 and from_fp32[1]
            feeds_only_fp32 = all(
                out not in graph_outputs and consumers[out] and all(c in keep for c in consumers[out])
                for out in node.output)
            if divides_by_fp32 or (any(from_fp32) and feeds_only_fp32):
                keep.add(i)
                changed = True
    return keep


def convert_float_graph(model: Any, precision: str, keep_io_types: bool = True) -> Any:
    """A copy of `model` with float32 computation in fp16/bf16 except norms and softmax (module doc)."""
    onnx = require("onnx", "converting a graph to fp16/bf16")
    validate_precision(precision)
    if precision == "fp32":
        return model
    from onnx import helper, numpy_helper, shape_inference

    FLOAT, LOW = _onnx_types(onnx, precision)
    model = shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    graph = model.graph
    if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in graph.node for attr in node.attribute):
        raise SpecrtError("fp16/bf16 conversion does not support If/Loop/Scan subgraphs (export without control flow)")

    elem_type: dict[str, int] = {}
    for value in list(graph.value_info) + list(graph.input) + list(graph.output):
        if value.type.HasField("tensor_type"):
            elem_type[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        elem_type[init.name] = init.data_type

    keep = fp32_nodes(graph)
    wants: dict[str, set[int]] = defaultdict(set)  # float32 tensor -> the types its consumers want
    for i, node in enumerate(graph.node):
        for index, name in enumerate(node.input):
            if name and elem_type.get(name) == FLOAT:
                fp32_only = (node.op_type, index) in FP32_ONLY_INPUTS or i in keep
                wants[name].add(FLOAT if fp32_only else LOW)

    # Sources: weights and Constant values become low precision when any consumer wants low.
    current: dict[str, int] = {}
    for init in graph.initializer:
        if init.data_type == FLOAT and LOW in wants[init.name]:
            init.CopyFrom(_to_low(numpy_helper.to_array(init), init.name, precision, numpy_helper))
        current[init.name] = init.data_type
    for value in graph.input:
        if value.name in elem_type:
            current[value.name] = elem_type[value.name]
            if not keep_io_types and elem_type[value.name] == FLOAT:
                value.type.tensor_type.elem_type = LOW
                current[value.name] = LOW

    new_nodes = []
    casts: dict[tuple[str, int], str] = {}

    def cast(name: str, to: int) -> str:
        if (name, to) not in casts:
            out = f"{name}__to_{'fp32' if to == FLOAT else precision}"
            new_nodes.append(helper.make_node("Cast", [name], [out], to=to, name=f"{out}__cast"))
            casts[(name, to)] = out
        return casts[(name, to)]

    for i, node in enumerate(graph.node):
        prec = FLOAT if i in keep else LOW
        if node.op_type in CONSTANT_OPS:
            _convert_constant(node, LOW, precision, wants, numpy_helper, FLOAT)
        for index, name in enumerate(node.input):
            have = current.get(name)
            if have not in (FLOAT, LOW) or not name:
                continue
            want = FLOAT if (node.op_type, index) in FP32_ONLY_INPUTS else prec
            if have != want:
                node.input[index] = cast(name, want)
        if node.op_type == "Cast" and prec == LOW:
            to = next(a for a in node.attribute if a.name == "to")
            if to.i == FLOAT:
                to.i = LOW
        for out in node.output:
            if node.op_type in CONSTANT_OPS:
                current[out] = LOW if LOW in wants[out] and elem_type.get(out) == FLOAT else elem_type.get(out, 0)
            elif elem_type.get(out) == FLOAT and node.op_type not in ATTR_TYPED_OPS:
                current[out] = prec
            elif out:
                current[out] = elem_type.get(out, 0)
        new_nodes.append(node)

    # Graph outputs keep fp32 (or become low): rename the producer's tensor and cast into the name.
    for value in graph.output:
        have = current.get(value.name)
        if have not in (FLOAT, LOW):
            continue
        want = FLOAT if keep_io_types or elem_type.get(value.name) != FLOAT else LOW
        if have != want:
            inner = f"{value.name}__{'fp32' if have == FLOAT else precision}"
            for node in new_nodes:
                node.input[:] = [inner if n == value.name else n for n in node.input]
                node.output[:] = [inner if n == value.name else n for n in node.output]
            new_nodes.append(helper.make_node("Cast", [inner], [value.name], to=want, name=f"{value.name}__cast_out"))
        value.type.tensor_type.elem_type = want

    graph.ClearField("node")
    graph.node.extend(new_nodes)
    graph.ClearField("value_info")  # stale float32 annotations would contradict the new types
    return model


def _to_low(array: np.ndarray, name: str, precision: str, numpy_helper: Any) -> Any:
    if precision == "fp16":
        array = np.where(np.isfinite(array), np.clip(array, -FP16_MAX, FP16_MAX), array).astype(np.float16)
    else:
        ml_dtypes = require("ml_dtypes", "converting a graph to bf16")
        array = array.astype(ml_dtypes.bfloat16)
    return numpy_helper.from_array(array, name)


def _attr_tensor(tensor: Any) -> Any:
    from onnx import helper

    return helper.make_attribute("value", tensor)


def _convert_constant(node: Any, low: int, precision: str, wants: dict, numpy_helper: Any, FLOAT: int) -> None:
    out = node.output[0]
    if low not in wants.get(out, ()):
        return
    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        node.attribute.append(_attr_tensor(_to_low(np.zeros(1, np.float32), "", precision, numpy_helper)))  # default 0.0f
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type == FLOAT:
            attr.t.CopyFrom(_to_low(numpy_helper.to_array(attr.t), attr.t.name, precision, numpy_helper))
        elif attr.name in ("value_float", "value_floats"):
            raise SpecrtError(f"Constant {node.name!r} uses {attr.name}; fold it into a tensor value before converting")


def write_converted(onnx_path: str | Path, source_sha256: str, precision: str, out_dir: str | Path) -> Path:
    """Convert `onnx_path` to `precision` into `out_dir`/<stem>.<precision>.onnx, reusing a fresh earlier copy.

    A stamp file beside it records the source hash and converter version; either changing
    makes the copy stale. Graphs under 2 GB are written through one atomic rename; larger
    ones are saved with external data (weights in <name>.data beside the graph).
    """
    import json

    from .cache import atomic_write_bytes

    onnx = require("onnx", "converting a graph to fp16/bf16")
    onnx_path, out_dir = Path(onnx_path), Path(out_dir)
    target = out_dir / f"{onnx_path.stem}.{precision}.onnx"
    stamp_path = target.with_suffix(".json")
    stamp = {"source_sha256": source_sha256, "precision": precision, "converter": CONVERTER_VERSION}
    if target.is_file() and stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return target
    model = convert_float_graph(onnx.load(str(onnx_path)), precision)
    out_dir.mkdir(parents=True, exist_ok=True)
    if model.ByteSize() < (2 << 30) - (64 << 20):
        atomic_write_bytes(target, model.SerializeToString())
    else:
        onnx.save(model, str(target), save_as_external_data=True, location=f"{target.name}.data")
    atomic_write_bytes(stamp_path, json.dumps(stamp).encode())
    return target
